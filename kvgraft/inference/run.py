"""`kvgraft run` as one call: the release verified under a policy, an entry (or the prompt's prefix) grafted, continued."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvgraft.errors import InputError
from kvgraft.inference.reapply import Conditions

if TYPE_CHECKING:
    from kvgraft.inference.graft import Continuation
    from kvgraft.signing.policy import VerifyPolicy
    from kvgraft.signing.verify import VerifiedRelease


@dataclass(frozen=True)
class RunSettings:
    """`kvgraft run`'s options: the release, what to graft and continue, the model and the conditions replayed
    (`conditions`: device, and dtype and attention unless None, the release's recorded ones)."""

    release: str
    entry: str | None = None
    prompt: str = ""
    prefix: bool = False
    max_new_tokens: int = 64
    model: str | None = None
    conditions: Conditions = Conditions(device="auto")
    force: bool = False

    def checked(self) -> RunSettings:
        """These settings, once the options that need no release are sound; torch is not imported (a typo costs
        nothing: torch alone takes seconds)."""
        self.conditions.checked()
        if self.max_new_tokens < 0:
            raise InputError(f"--max-new-tokens {self.max_new_tokens}: expected 0 or more")
        return self


def run(s: RunSettings, policy: Callable[[], VerifyPolicy], *, progress: Any = None) -> tuple[VerifiedRelease, Continuation]:
    """The release verified under `policy()` before the model loads (a release verify refuses costs no model load and
    grafts nothing), the entry or prefix checked, the model loaded as the release records it, then graft and continue."""
    s.checked()
    from kvgraft.inference import graft
    from kvgraft.signing.verify import verified

    trusted = policy()
    if s.prefix == (s.entry is not None):
        raise InputError("name an entry to graft (--entry), or graft the prompt's longest prefix (--prefix): one of them")
    checked = verified(s.release, trusted)
    with checked:  # closed when done (a remote release: its folder removed); an error inside names its location
        if s.entry is not None:
            checked.release.entry(s.entry)  # an unknown entry is refused before the model loads
        else:
            graft.check_prefix_usable(checked.release)  # so is a release no prefix can be grafted from
        c = s.conditions
        lm = graft.model_for(checked, s.model, device=c.device, dtype=c.dtype, attn=c.attn, force=s.force, progress=progress)
        return checked, graft.run(checked, s.entry, lm, s.prompt, max_new_tokens=s.max_new_tokens, force=s.force,
                                  attn=c.attn, dtype=c.dtype, prefix=s.prefix)
