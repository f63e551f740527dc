"""The git tools (tool.py) and the safe way every git process of the project runs."""
