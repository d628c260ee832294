"""The new-token ratio: how much of their remaining max_new_tokens running requests are assumed to still need
(docs/scheduling.md §2). It starts at init, decays each decode step without memory shortage down to a floor,
jumps after a retraction, and resets to init when the scheduler goes idle."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from toolkit.runtime.scheduler.request import Req
from toolkit.runtime.scheduler.retraction import RETRACT_DECODE_STEPS

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600


@dataclass
class NewTokenRatio:
    init: float
    floor: float
    decay: float
    value: float

    @classmethod
    def from_conservativeness(cls, schedule_conservativeness: float) -> NewTokenRatio:
        init = min(INIT_NEW_TOKEN_RATIO * schedule_conservativeness, 1.0)
        floor = min(init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        return cls(init=init, floor=floor, decay=(init - floor) / NEW_TOKEN_RATIO_DECAY_STEPS, value=init)

    def step_decay(self) -> None:
        self.value = max(self.value - self.decay, self.floor)

    def reset(self) -> None:
        self.value = self.init

    def set_after_retraction(self, remaining: Sequence[Req]) -> None:
        """What the requests left running are expected to need: their decoded tokens plus RETRACT_DECODE_STEPS
        each, over their total max_new_tokens (SGLang's `retract_decode`)."""
        decoded = sum(len(r.output_ids) for r in remaining)
        max_new = sum(r.sampling_params.max_new_tokens for r in remaining)
        self.value = 1.0 if max_new == 0 else min(1.0, (decoded + RETRACT_DECODE_STEPS * len(remaining)) / max_new)
