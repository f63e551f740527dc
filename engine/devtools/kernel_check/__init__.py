"""Every Triton kernel the engine launches, compiled for Hopper (and Blackwell) without a GPU.

Triton compiles for a GPU target on any machine: `triton.compile(ASTSource(...),
target=GPUTarget("cuda", 90, 32))` runs the whole pipeline to a cubin with the
ptxas inside the Triton wheel. The interpreter the CPU tests use does not: it
reads plain module globals and never allocates registers or shared memory,
so a kernel can pass every CPU test and still fail to compile (as W4A16 and
FP8-block once did on an H200) or spill. This package closes that gap:

- gpus:      the GPUs checked (H200 sm_90; B200 sm_100 where the Triton wheel has its ptxas)
- shapes:    the supported models' shapes (the planner's presets) and the sizes
             the launchers' own config functions distinguish
- calls:     the launcher calls of one deployment, on meta tensors
- plan:      runs them as if on the GPU and records each kernel launch with
             Triton's own argument specialization
- compiler:  compiles one launch for one GPU, reads registers, spills and shared
             memory from the cubin, and caches that by Triton's cache key
- verdict:   what fails (compile errors, shared memory over the limit, spills in the
             decode, MLA, W4A16, FP8-block and fused-MoE kernels) and the table
- check:     plan, compile (in worker processes), judge: the report

`python -m engine.devtools.kernel_check` prints the table and writes it as JSON;
`make test` runs it (tests/engine/test_gpu_compile.py). Needs triton; run it
without TRITON_INTERPRET (the CLI clears it before any kernel is defined).
"""
