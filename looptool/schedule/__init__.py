"""The schedule layer: schedules as data (steps.py), the loop tree they give (looptree.py), printing."""
from .looptree import (ATOMIC_SUMS, AUTOSCHEDULE, LEGALITY, BufferPlan, Limit, LoopNode, LoopTree, StmtNode, accesses,
                       across_blocks, blocked, thread_bound, walk)
from .steps import (ANNOTATIONS, BLOCK_AXES, GPU_AXES, TENSOR_INSTRUCTIONS, Loop, Schedule, Tail, pipeline_copier,
                    pipeline_depth, pipeline_persistent, tensor_role)

__all__ = ["ATOMIC_SUMS", "AUTOSCHEDULE", "LEGALITY", "BufferPlan", "Limit", "LoopNode", "LoopTree", "StmtNode",
           "accesses", "across_blocks", "blocked", "thread_bound", "walk", "ANNOTATIONS", "BLOCK_AXES", "GPU_AXES",
           "TENSOR_INSTRUCTIONS", "Loop", "Schedule", "Tail", "pipeline_copier", "pipeline_depth",
           "pipeline_persistent", "tensor_role"]
