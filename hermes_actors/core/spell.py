"""Pure: a spell of failures in a row, said once when it starts and once when it ends.

Something that fails again and again (a full disk failing each journal write, a bot whose
model fails each turn) must be said where an operator looks, but once, not at each failure:
the spell is said when its failures in a row reach a threshold (1: at the first), nothing more
is said while it lasts, and its end (the first success after it was said) is said once, with
its count. A success before the threshold ends nothing that was said. :class:`Spell` is that
rule, as values; whoever owns the failing thing keeps one and logs what it answers.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Spell"]


@dataclass(frozen=True, slots=True)
class Spell:
    """Failures in a row since the last success, and whether the spell was said.

    Attributes:
        failures: failures since the last success.
        said: the spell reached its threshold and was said (its end will be).
    """

    failures: int = 0
    said: bool = False

    def failed(self, say_at: int = 1) -> tuple[Spell, bool]:
        """Pure: one more failure.

        Args:
            say_at: the failures in a row at which the spell is said (at least 1).

        Returns:
            The spell after it, and whether to say the spell now (once per spell: at its
            ``say_at``-th failure in a row).
        """
        failures = self.failures + 1
        say = not self.said and failures >= max(1, say_at)
        return Spell(failures, self.said or say), say

    def landed(self) -> tuple[Spell, int]:
        """Pure: a success.

        Returns:
            A fresh spell, and the failures of the spell that ended here when it was said (its end is
            to be said, with that count); 0 when none was said (nothing to say).
        """
        return Spell(), self.failures if self.said else 0
