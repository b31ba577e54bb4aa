"""The schedule layer: schedules as data (steps.py), the loop tree they give (looptree.py), printing."""
from .looptree import (AUTOSCHEDULE, LEGALITY, BufferPlan, Limit, LoopNode, LoopTree, StmtNode, accesses, blocked,
                       thread_bound, walk)
from .steps import (ANNOTATIONS, BLOCK_AXES, GPU_AXES, TENSOR_INSTRUCTIONS, Loop, Schedule, Tail, pipeline_copier,
                    pipeline_depth, pipeline_persistent, tensor_role)

__all__ = ["AUTOSCHEDULE", "LEGALITY", "BufferPlan", "Limit", "LoopNode", "LoopTree", "StmtNode", "accesses", "blocked",
           "thread_bound", "walk", "ANNOTATIONS", "BLOCK_AXES", "GPU_AXES", "TENSOR_INSTRUCTIONS", "Loop", "Schedule", "Tail",
           "pipeline_copier", "pipeline_depth", "pipeline_persistent", "tensor_role"]
