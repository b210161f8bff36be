"""Tokens and keys of the contract (sections 1, 2, 4): building them, and parsing them back.

A token is `[A-Za-z0-9_-]+`, at most MAX_TOKEN (256) characters long; keys join tokens with dots. Every parser here
raises BadKey with a sentence that says what is wrong, so a bad key is named and never fatal (section 7).
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Final

from mesh_provisioner.messages.records import End

# A longer word is not a token: a key of such words would be longer than a NATS server takes as a subject (its 4 KB
# control line), and a server sent one closes the connection, which nats-py then never opens again.
MAX_TOKEN: Final = 256
_TOKEN: Final = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_TOKEN}}}")
CREDENTIAL_SUFFIX: Final = "-credential"


class BadKey(ValueError):
    """A key or name that is not made of tokens as the contract says."""


@functools.lru_cache(maxsize=1 << 16)
def is_token(word: str) -> bool:
    """Whether a name is one token.

    Remembered for the most recent 65,536 words: a composition builds and parses keys some 500 times, from the same
    few thousand node, module and provision names (a tenth of its time went to the regular expression); bounded, so
    that words from bad input do not fill memory.
    """
    return _TOKEN.fullmatch(word) is not None


def _tokens(key: str, counts: tuple[int, ...], what: str) -> list[str]:
    parts = key.split(".")
    if len(parts) not in counts or not all(is_token(p) for p in parts):
        shape = " or ".join(str(n) for n in counts)
        raise BadKey(f"{key!r} is not {what}: {shape} tokens joined by dots")
    return parts


def join(*tokens: str) -> str:
    """Tokens joined into a key, empty ones left out; raises BadKey when one is not a token."""
    words = [t for t in tokens if t != ""]
    for t in words:
        if not is_token(t):
            raise BadKey(f"{t!r} is not a token ([A-Za-z0-9_-]+)")
    return ".".join(words)


def plan_key(node: str, module: str) -> str:
    """`<node>.<module>`: the key of a plan, a refusal, a have or a resolved choice."""
    return join(node, module) if node and module else _missing(node, module)


def provision_key(node: str, consumer: str, provision: str, local: str = "") -> str:
    """`<node>.<consumer>.<provision>[.<local>]` (section 4)."""
    if not (node and consumer and provision):
        _missing(node, consumer, provision)
    return join(node, consumer, provision, local)


def _missing(*tokens: str) -> str:
    raise BadKey(f"a key needs every token, and one of {list(tokens)} is empty")


def parse_plan_key(key: str) -> tuple[str, str]:
    """The node and module of `<node>.<module>`."""
    node, module = _tokens(key, (2,), "a node and a module")
    return node, module


def parse_provision_key(key: str) -> tuple[str, str, str, str]:
    """The node, consumer, provision and local ("" when none) of a provision key."""
    parts = _tokens(key, (3, 4), "a provision key")
    return parts[0], parts[1], parts[2], parts[3] if len(parts) == 4 else ""


def node_of(key: str) -> str:
    """The first token of a key: the node of a plan, refusal, provision, have or placement key."""
    return key.split(".", 1)[0]


def shaped_as_shared_credential(key: str) -> bool:
    """Whether a key has the form of a provider's shared credential, `<provider node>.<provider>.<provision>-credential`
    (section 4): only such a key may be one another key depends on as that."""
    return key.count(".") == 2 and key.endswith(CREDENTIAL_SUFFIX)


def want_key(node: str, module: str) -> str:
    """`want.<node>.<module>`."""
    return "want." + plan_key(node, module)


def parse_want_key(key: str) -> tuple[str, str]:
    """The node and module of `want.<node>.<module>`."""
    parts = _tokens(key, (3,), "a want key")
    if parts[0] != "want":
        raise BadKey(f"{key!r} is not a want key: it does not start with want.")
    return parts[1], parts[2]


def parse_have_key(key: str) -> tuple[str, str]:
    """The node and module of a have key; the module is "" for the node's own `<node>`."""
    parts = _tokens(key, (1, 2), "a have key")
    return parts[0], parts[1] if len(parts) == 2 else ""


def parse_build_key(key: str) -> tuple[str, str]:
    """The module and fingerprint of `<module>.<fp>`."""
    module, fp = _tokens(key, (2,), "a build key")
    return module, fp


def parse_token_key(key: str, what: str) -> str:
    """A key that is one token: a node's placement, a module, a manifest id."""
    return _tokens(key, (1,), what)[0]


def credential_key(form: str, consumer: End, provider: End, provision: str, local: str) -> str | None:
    """The key of a provision's credential (section 4), None when it names no credential form.

    `own` is the consumer's own value, on the consumer's node; `shared` is the provider's one value, on the
    provider's node, for all consumers.
    """
    if form == "own":
        return provision_key(consumer.node, consumer.module, provision + CREDENTIAL_SUFFIX, local)
    if form == "shared":
        return provision_key(provider.node, provider.module, provision + CREDENTIAL_SUFFIX)
    return None


def ask_id(key: str, unix_seconds: int) -> str:
    """`retire-<key with every . made ->-<unix seconds>-<h>`, `<h>` the first 8 hex digits of the key's SHA-256
    (section 5.4): the one place an ask id is made.

    Without `<h>`, keys that differ only where a dot and a dash stand (`ace.my-app.db` and `ace.my.app-db`) raised
    in the same second would share an id, and JetStream would drop the second ask as a duplicate message.
    """
    digest = hashlib.sha256(key.encode()).hexdigest()[:ASK_HASH_DIGITS]
    return f"retire-{key.replace('.', '-')}-{unix_seconds}-{digest}"


ASK_HASH_DIGITS: Final = 8
_ASK_HASH: Final = re.compile(rf"[0-9a-f]{{{ASK_HASH_DIGITS}}}")
# Unix seconds of a time a datetime can hold (years 1 to 9999): an ask id's time, at most 12 ASCII digits.
_UNIX_SECONDS: Final = re.compile(r"[0-9]{1,12}")
_LAST_SECOND: Final = 253402300799  # 9999-12-31T23:59:59Z


def ask_raised_at(ask: str) -> int | None:
    """The unix seconds an ask id says it was raised at, None when it does not end with such a time and a key's hash
    as `ask_id` makes them."""
    head, _, digest = ask.rpartition("-")
    _, _, seconds = head.rpartition("-")
    if _ASK_HASH.fullmatch(digest) is None or _UNIX_SECONDS.fullmatch(seconds) is None:
        return None
    raised = int(seconds)
    return raised if raised <= _LAST_SECOND else None
