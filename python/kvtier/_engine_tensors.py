"""What identifies an engine's KV tensors from one CUDA call to the next, so the CUDA door works
out a set of tensors' views once (kvtier._cuda's plans): their signature (addresses, shapes,
strides), and the cheaper check that they are the very same objects at the same addresses."""
from __future__ import annotations

import operator
from typing import Any, List, Optional, Tuple


def signature(x: Any) -> Any:
    """Where each of the engine's tensors lies and how it is shaped (None, a tensor, or lists)."""
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        return tuple(signature(t) for t in x)
    return (x.data_ptr(), tuple(x.shape), x.stride(), x.dtype, x.device.index)


def tensors(x: Any) -> List[Any]:
    """The tensors of an engine argument (a tensor, a list of them or of (k, v) pairs), flat."""
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in tensors(item)]
    return [x]


class SameTensors:
    """A plan and the engine tensors it was found for, held (so their ids are not reused) with
    their addresses: the same objects at the same addresses have the same plan. A tensor whose
    storage was swapped (set_) moves its address, so the signature is looked up again. Working
    the signature out took ~0.1 ms of the H200 host's time on the way to a load's first kernel."""

    def __init__(self, engine: Tuple[Any, Any, str, Optional[int]], plan: Any) -> None:
        self.engine = engine
        self.tensors = tensors(engine[0]) + tensors(engine[1])
        self.addresses = [t.data_ptr() for t in self.tensors]
        self.plan = plan

    def same(self, engine: Tuple[Any, Any, str, Optional[int]]) -> bool:
        e = self.engine
        if not (engine[0] is e[0] and engine[1] is e[1] and engine[2] == e[2] and engine[3] == e[3]):
            return False
        now = tensors(engine[0]) + tensors(engine[1])  # a list may have been changed in place
        return (len(now) == len(self.tensors) and all(map(operator.is_, now, self.tensors))
                and [t.data_ptr() for t in now] == self.addresses)
