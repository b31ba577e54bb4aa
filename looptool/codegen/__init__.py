"""The code generation layer: LLVM IR for the host CPU (cpu.py) and PTX for NVIDIA GPUs (gpu.py)."""
