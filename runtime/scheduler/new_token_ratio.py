"""The new-token ratio: how much of their remaining max_new_tokens running requests are assumed to still need
(LOG_FORMATS §8). It starts at init, decays each decode step without memory shortage down to a floor, jumps
after a retraction, and resets to init when the scheduler goes idle."""
from __future__ import annotations

from dataclasses import dataclass

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

    def set_after_retraction(self, value: float) -> None:
        self.value = value
