"""Composing a node (contract 5.2, the seeds' `ComposeNode` clauses 1 to 5) and judging one key again (`Rejudge`).

A node is composed twice: at the builds its wants name (its plans, what its client applies) and at the newest build
of each module, so that a build adding a requirement has its key before its want. A provision is needed while either
composition needs it, or while another node's provision depends on it; one no longer needed turns `retiring` and the
operator is asked (5.4).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from datetime import datetime

import msgspec

from mesh_provisioner.contract import HAVE, PLANS, PROVISIONS, REFUSED, VAULT_MODULE, WANTS
from mesh_provisioner.messages import records as r
from mesh_provisioner.messages.writes import Write
from mesh_provisioner.rules import keys as k
from mesh_provisioner.rules.compose import CannotCompose, Memo, compose
from mesh_provisioner.rules.judge import outcome
from mesh_provisioner.rules.retire import raise_ask, retired, retiring_why
from mesh_provisioner.rules.view import Entry, View, not_a_node
from mesh_provisioner.rules.writing import Writes, provision_of, same, told, utc


class Result(msgspec.Struct, frozen=True):
    """What one node's composition did, and the writes that make it so."""

    composed: r.Composed
    writes: list[Write]


class Judged(msgspec.Struct, frozen=True):
    """What judging one key again said ("" when nothing changed), and its writes."""

    said: str = ""
    writes: list[Write] = []


def wanted_on(view: View, node: str, problems: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The build each want on a node names, by module; and each module whose want cannot be read, with why.

    A want key that is not made of tokens names no module: it is said in problems (section 7).
    """
    wanted: dict[str, str] = {}
    unreadable: dict[str, str] = {}
    for module, e in _entries_by_module(view, WANTS, node, k.parse_want_key, "want", problems):
        want = e.get(r.Want)
        if want is None:
            unreadable[module] = f"its want cannot be read: {e.error}"
        elif want.wanted:
            wanted[module] = want.wanted
    return wanted, unreadable


def running_on(view: View, node: str, problems: list[str]) -> dict[str, str]:
    """The build each module's have on a node says it runs: what a module with no want is composed at.

    A have key that is not made of tokens names no module: it is said in problems (section 7).
    """
    out: dict[str, str] = {}
    for module, e in _entries_by_module(view, HAVE, node, k.parse_have_key, "have", problems):
        have = e.get(r.Have)
        if module and have is not None and have.fp:
            out[module] = have.fp
    return out


def _entries_by_module(
    view: View, state: str, node: str, parse: Callable[[str], tuple[str, str]], what: str, problems: list[str]
) -> Iterator[tuple[str, Entry]]:
    """Each key of a node's want or have with the module it names; a key not made of tokens is said in problems."""
    for key in view.keys(state, node):
        try:
            _, module = parse(key)
        except k.BadKey as err:
            problems.append(f"the {what} {key} is ignored: {err}")
            continue
        e = view.get(state, key)
        if e is not None:
            yield module, e


def vault_node(view: View) -> str:
    """The node mesh-vault is placed on, the first in sorted order: the provider of every credential."""
    nodes = view.placed_on(VAULT_MODULE)
    return nodes[0] if nodes else ""


def provider_plan(
    view: View, p: r.PlanProvision, node: str, here: dict[str, r.Plan]
) -> tuple[tuple[str, str], ...] | None:
    """The (provision, local) pairs of a provision's provider's plan: this composition's when it is on this node,
    else the one in `plans`."""
    if p.provider == node:
        plan = here.get(p.provider_module)
        return tuple((pp.provision, pp.local) for pp in plan.provisions) if plan is not None else None
    return view.plan_provisions(f"{p.provider}.{p.provider_module}")


def depends_on(
    consumer: r.End, p: r.PlanProvision, plan: tuple[tuple[str, str], ...] | None
) -> tuple[str, ...]:
    """A provision's depends-on (section 4): its credential key first, then the keys of its provider's own plan."""
    provider = r.End(module=p.provider_module, node=p.provider)
    out = []
    cred = k.credential_key(p.credential, consumer, provider, p.provision, p.local)
    if cred is not None:
        out.append(cred)
    for provision, local in plan or ():
        out.append(k.provision_key(p.provider, p.provider_module, provision, local))
    return tuple(out)


def compose_node(view: View, node: str, now: datetime, writes_on: Callable[[str], bool] | None = None) -> Result:
    """Compose one node: its refusals, its plans, and every provision either composition needs (5.2).

    `writes_on` says which nodes' keys this seat writes (contract 8.1; None: every node's). A provider's shared
    credential on a node it does not write is left to that node's writer, which judges it from the keys that depend
    on it (`rejudge`): the fixed point is the same, only who writes the key differs.
    """
    out = r.Composed(node=node)
    no_node = not_a_node(node)
    if no_node:
        out.problems.append(no_node)
        return Result(out, [])
    writes = Writes(view)
    wanted, unreadable = wanted_on(view, node, out.problems)
    # A module on the node with no want (the bus on the control node) is composed at the build its have names.
    for module, fp in running_on(view, node, out.problems).items():
        wanted.setdefault(module, fp)
    memo = Memo()
    try:
        at_wants = compose(writes.view, node, wanted, memo)
        newest = compose(writes.view, node, {}, memo)
    except CannotCompose as err:
        out.problems.append(str(err))
        return Result(out, [])
    held_at_wants = {**at_wants.held, **unreadable}
    plans_at_wants = {m: p for m, p in at_wants.plans.items() if m not in unreadable}
    # A module held at its wanted build has no plan composed: its last plan and provisions are kept, said in
    # `refused`. One held at its newest build alone keeps its plan at its want.
    out.modules_held = dict(sorted(held_at_wants.items()))
    for module in sorted(newest.held):
        if module not in held_at_wants:
            out.problems.append(f"{module} at its newest build is not composed: {newest.held[module]}")
    _write_refused(writes, node, held_at_wants, now, out)
    _write_plans(writes, node, plans_at_wants, held_at_wants, out)

    needed: dict[str, r.Provision] = {}
    elsewhere: dict[str, r.Provision] = {}
    vault = vault_node(view)
    for plans in (plans_at_wants, newest.plans):
        for module, plan in sorted(plans.items()):
            if plans is newest.plans and plans_at_wants.get(module) is plan:
                continue  # the same plan at both builds (one memo): it needs nothing more
            consumer = r.End(module=module, node=node)
            for p in plan.provisions:
                provider = r.End(module=p.provider_module, node=p.provider)
                try:
                    deps = depends_on(consumer, p, provider_plan(writes.view, p, node, plans_at_wants))
                    key = k.provision_key(node, module, p.provision, p.local)
                    cred = k.credential_key(p.credential, consumer, provider, p.provision, p.local)
                except k.BadKey as err:
                    out.problems.append(str(err))
                    continue
                have = needed.get(key)
                if have is None:
                    needed[key] = r.Provision(
                        provision=p.provision, local=p.local, consumer=consumer, provider=provider, depends_on=deps,
                    )
                elif cred is not None and cred not in have.depends_on:
                    # The newest build names a credential the wanted build does not: the key depends on it too
                    # (section 4, its credential key first), or the credential's node would find nothing
                    # depending on the credential this composition keeps, and retire it for ever.
                    needed[key] = msgspec.structs.replace(have, depends_on=(cred, *have.depends_on))
                # Its credential is a provision of its own, the vault's: on the consumer's node for a value of
                # the consumer's own, on the provider's for the provider's one shared value.
                if cred is None:
                    continue
                if not vault:
                    out.problems.append(f"no node runs mesh-vault, so the credential {cred} has no provider")
                    continue
                cnode, cmodule, cprovision, clocal = k.parse_provision_key(cred)
                credential = r.Provision(
                    provision=cprovision, local=clocal, consumer=r.End(module=cmodule, node=cnode),
                    provider=r.End(module=VAULT_MODULE, node=vault),
                )
                if cnode == node:
                    needed.setdefault(cred, credential)
                elif writes_on is None or writes_on(cnode):
                    elsewhere[cred] = credential
    _judge_elsewhere(writes, elsewhere, now, out)
    _judge_node(writes, node, needed, held_at_wants, now, out, writes_on)
    return Result(out, writes.done(first_node=node))


def _write_refused(writes: Writes, node: str, held: dict[str, str], now: datetime, out: r.Composed) -> None:
    """Keep why each held module of the node is held; delete the refusal of one that composes again."""
    for module, why in sorted(held.items()):
        try:
            key = k.plan_key(node, module)
        except k.BadKey as err:
            out.problems.append(str(err))
            continue
        e = writes.view.get(REFUSED, key)
        was = e.get(r.Refusal) if e is not None else None
        if was is not None and was.why == why:
            continue
        writes.put(REFUSED, key, r.encode(r.Refusal(node=node, module=module, why=why, since=utc(now))))
    for key in sorted(writes.view.keys(REFUSED, node)):
        if key.partition(".")[2] not in held:
            writes.delete(REFUSED, key)


def _write_plans(
    writes: Writes, node: str, plans: dict[str, r.Plan], held: dict[str, str], out: r.Composed
) -> None:
    """Write each plan that differs; delete the node's plans of modules no longer composed, a held one's kept."""
    for module, plan in sorted(plans.items()):
        try:
            key = k.plan_key(node, module)
        except k.BadKey as err:
            out.problems.append(str(err))
            continue
        raw = r.encode(r.PlanRecord(node=node, module=module, plan=plan))
        e = writes.view.get(PLANS, key)
        if e is not None and e.raw == raw:
            continue
        writes.put(PLANS, key, raw)
        out.plans_written.append(key)
    for key in sorted(writes.view.keys(PLANS, node)):
        module = key.partition(".")[2]
        if module in plans or module in held:
            continue
        writes.delete(PLANS, key)
        out.plans_removed.append(key)


def _judge_elsewhere(writes: Writes, needed: dict[str, r.Provision], now: datetime, out: r.Composed) -> None:
    """Judge each needed key of another node (a provider's shared credential); that node keeps it while needed."""
    for key, want in sorted(needed.items()):
        said = _judge_shared(writes, key, want, now, writes.view.unrecorded())
        if said:
            out.provisions_changed.append(said)


def _judge_shared(writes: Writes, key: str, want: r.Provision, now: datetime, judged: View) -> str:
    """Bring a provider's shared credential to what its provider says of it (read from `judged`), its reference
    kept; answers what changed ("" when nothing did)."""
    have, _ = provision_of(writes.view, key)
    kept = want if have is None else msgspec.structs.replace(want, reference=have.reference)
    nxt = outcome(judged, key, kept)
    if have is not None and same(have, nxt):
        return ""
    writes.provision(key, nxt, now)
    return told(key, have, nxt)


def shared_credential(view: View, key: str, writes_on: Callable[[str], bool]) -> r.Provision | None:
    """The provision a provider's shared credential is, as a key depending on it from a node this seat does not
    write says (section 4: its consumer is the provider, its provider the vault), or, while the credential is missing,
    a key of another node depending on it; never a retiring key. None when no such key depends on it, or no node runs
    mesh-vault.

    A key of another process's node cannot write the credential in its composition (contract 8.1). A key of another
    node this seat writes does, but one composed while this seat did not yet compose the credential's node (another
    process held it, or it was just taken) is not composed again for it: nothing it reads changed. A key of the
    credential's own node is composed with it, and a retiring key needs nothing (as with S = 1).
    """
    if not k.shaped_as_shared_credential(key):
        # Said before the loop below, which a key thousands of consumers depend on would run at each of its judgments.
        return None
    vault = vault_node(view)
    if not vault:
        return None
    missing = view.get(PROVISIONS, key) is None
    node = k.node_of(key)
    for user in sorted(view.dependents(key)):
        there = k.node_of(user)
        if writes_on(there) and not (missing and there != node):
            continue
        p, _ = provision_of(view, user)
        # Its credential is first in its depends-on, or second when its newest build names another form (5.2).
        if p is None or p.state == r.RETIRING or key not in p.depends_on[:2]:
            continue
        if k.credential_key("shared", p.consumer, p.provider, p.provision, p.local) != key:
            continue
        cnode, cmodule, cprovision, clocal = k.parse_provision_key(key)
        return r.Provision(provision=cprovision, local=clocal, consumer=r.End(module=cmodule, node=cnode),
                           provider=r.End(module=VAULT_MODULE, node=vault))
    return None


def _judge_node(
    writes: Writes,
    node: str,
    needed: dict[str, r.Provision],
    held_modules: dict[str, str],
    now: datetime,
    out: r.Composed,
    writes_on: Callable[[str], bool] | None,
) -> None:
    """Bring the node's keys to what is needed and what each provider said; retire the rest, asking first."""
    view = writes.view
    # What a key's provider says of it is read, not recorded as the composition's: the key's own judgment reads it
    # and keeps the key's state (5.3, `rejudge`), so a provider's have or want changing wakes that key's judgment, not
    # every composition of a node whose keys it provides. The composition still writes what it finds, and its run
    # keeps what the key's judgment read (`judging`): after the composition's writes, `rejudge` reads the same. A
    # partitioned seat's `rejudge` first reads the keys depending on a key of a shared credential's form
    # (`shared_credential`): the run reads them too.
    kept: dict[str, r.Provision] = {}
    for key in view.judged_on(node):
        p, _ = provision_of(view, key)
        if p is None:
            continue
        # A key of a module held on the node that its composition no longer names is left as it is: not
        # composed is not unneeded.
        if key not in needed and p.consumer.node == node and p.consumer.module in held_modules:
            continue
        kept[key] = p
    # A key of this node that another node's provision depends on stays needed (a provider's own needs while a
    # consumer elsewhere depends on them; a shared credential others depend on is not among the keys judged here at
    # all: those nodes judge it, `judged_on`). Asked of each key not needed, not of the node as a whole: a consumer
    # elsewhere starting to depend on a key this node needs already changes nothing here, and wakes nothing here.
    for key, p in kept.items():
        if key not in needed and any(k.node_of(u) != node for u in view.dependents(key)):
            needed[key] = msgspec.structs.replace(p, state="", why="", ask="", warrant=None)
    for key in _depended_first(needed.keys() | kept.keys(), needed):
        have = kept.get(key)
        if have is None and key in needed:
            have, _ = provision_of(view, key)  # a shared credential this node needs too, judged here as well
        if key in needed:
            nxt = needed[key]
            if have is not None:
                nxt = msgspec.structs.replace(nxt, reference=have.reference)
            run = view.judging(key)
            if writes_on is not None:
                # What its own judgment reads first (`rejudge`), kept with the run so that judgment is not made again
                # only to read it; whichever key needs a shared credential, it is the same provision (section 4).
                shared_credential(run, key, writes_on)
            nxt = outcome(run, key, nxt)
        elif have is not None and have.state == r.RETIRING:
            nxt = have
            if not nxt.ask and nxt.warrant is None:
                nxt = _ask(key, nxt, now, out)
            gone = retired(view, key, have)
            if gone:
                writes.delete(PROVISIONS, key)
                out.provisions_changed.append(f"{key} (retired: {gone})")
                continue
        else:
            assert have is not None
            nxt = msgspec.structs.replace(
                have,
                state=r.RETIRING,
                why=retiring_why(node, have),
                ask="",
                warrant=None,
            )
            nxt = _ask(key, nxt, now, out)
        if have is not None and same(have, nxt):
            continue
        writes.provision(key, nxt, now)
        out.provisions_changed.append(told(key, have, nxt))


def _depended_first(keys: Iterable[str], needed: dict[str, r.Provision]) -> list[str]:
    """The keys in sorted order, each after the keys among them it depends on: a credential is judged before the key
    that waits for it, so that one composition says what the key's provider makes of both (section 4, 5.3)."""
    among = sorted(keys)
    inside = set(among)
    out: list[str] = []
    placed: set[str] = set()

    def deps(key: str) -> Iterator[str]:
        p = needed.get(key)
        return iter(p.depends_on if p is not None else ())

    # Depth first, each key after its dependencies, with a stack of its own: a nested function calling itself is a
    # reference cycle, left for the collector to free at each composition.
    for root in among:
        if root in placed:
            continue
        placed.add(root)
        stack = [(root, deps(root))]
        while stack:
            key, left = stack[-1]
            for dep in left:
                if dep in inside and dep not in placed:
                    placed.add(dep)
                    stack.append((dep, deps(dep)))
                    break
            else:
                stack.pop()
                out.append(key)
    return out


def _ask(key: str, p: r.Provision, now: datetime, out: r.Composed) -> r.Provision:
    """A retiring key with its ask raised, said in the report; a problem when the ask may not be raised."""
    asked, why = raise_ask(key, p, now)
    if why:
        out.problems.append(why)
    elif asked.ask != p.ask:
        out.retiring_asked.append(key)
    return asked


def rejudge(view: View, key: str, now: datetime, writes_on: Callable[[str], bool] | None = None) -> Judged:
    """Set one key's state again from its provider's outcome; a retiring key whose provider let it go is deleted.

    With `writes_on` (a partitioned seat, contract 8.1), a provider's shared credential that a key of a node this
    seat does not write depends on is judged here as that key's composition would judge it, made when missing.
    """
    writes = Writes(view)
    want = shared_credential(view, key, writes_on) if writes_on is not None else None
    if want is not None:
        said = _judge_shared(writes, key, want, now, writes.view)
        return Judged(said, writes.done())
    have, _ = provision_of(view, key)
    if have is None:
        return Judged()
    if have.state == r.RETIRING:
        gone = retired(view, key, have)
        if not gone:
            return Judged()
        writes.delete(PROVISIONS, key)
        return Judged(f"{key} retired: {gone}", writes.done())
    nxt = outcome(view, key, have)
    if same(have, nxt):
        return Judged()
    writes.provision(key, nxt, now)
    return Judged(f"{key} {nxt.state}", writes.done())
