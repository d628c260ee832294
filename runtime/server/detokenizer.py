"""Incremental detokenization: text deltas that never end in half a UTF-8 character and never show a stop
string (or its beginning) before the request finishes."""
from __future__ import annotations

from toolkit.runtime.io_struct import FinishReason

REPLACEMENT = "\ufffd"  # what a decoder yields for an incomplete UTF-8 sequence


class IncrementalDetokenizer:
    def __init__(self, tokenizer, skip_special_tokens: bool = True, stop: list[str] | None = None) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""  # decoded so far (complete characters only)
        self.emitted = 0  # characters of `text` already handed out
        self._prefix_offset = 0
        self._read_offset = 0
        self._hold = max((len(s) for s in stop or []), default=1) - 1

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, new_ids: list[int]) -> str:
        """Add tokens; returns the text that is now safe to show."""
        self.ids.extend(new_ids)
        prefix_text = self._decode(self.ids[self._prefix_offset : self._read_offset])
        window_text = self._decode(self.ids[self._prefix_offset :])
        if len(window_text) > len(prefix_text) and not window_text.endswith(REPLACEMENT):
            self.text += window_text[len(prefix_text) :]
            self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
        return self._take(len(self.text) - self._hold)

    def finish(self, reason: FinishReason | None, last_ids: list[int] = ()) -> str:
        """Add the final tokens; returns the rest of the text, cut before the stop string that ended it."""
        self.ids.extend(last_ids)
        self.text = self._decode(self.ids)
        if reason is not None and reason.kind == "stop" and isinstance(reason.matched, str):
            position = self.text.find(reason.matched)
            if position != -1:
                self.text = self.text[:position]
        return self._take(len(self.text))

    def _take(self, upto: int) -> str:
        if upto <= self.emitted:
            return ""
        delta = self.text[self.emitted : upto]
        self.emitted = upto
        return delta
