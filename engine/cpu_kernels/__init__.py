"""Small C kernels for the CPU decode path, built once per machine (library.py)."""
