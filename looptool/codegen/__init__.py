"""The code generation layer: LLVM IR for the host CPU (cpu.py) and PTX for NVIDIA GPUs (gpu.py, with
gpu_tensor_cores.py and gpu_copies.py)."""
