"""Built-in reward allocators for openmanus-rl (entry-point group ``openmanus_rl.allocators``).

Select one with ``allocator=<name>`` (``configs/allocator/<name>.yaml``); see
:mod:`openmanus_rl_allocators.allocators` for where each puts the reward.
"""

from openmanus_rl_allocators.allocators import (
    DiscountedAllocator,
    LastTokenAllocator,
    PerTurnAllocator,
    UniformPositiveAllocator,
)

__all__ = ["LastTokenAllocator", "UniformPositiveAllocator", "DiscountedAllocator", "PerTurnAllocator"]
