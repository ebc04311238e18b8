"""The speculative loop: one clip from prefill to the last token.

    1. prefill the edge on the multimodal prompt; the cloud only remembers it (lazy prefill)
    2. the edge drafts up to k tokens (catching up first on tokens it has not consumed)
    3. gate: escalate if the block's uncertainty exceeds the threshold (the entropy gate), or its
       meaning score exceeds the meaning gate's (gate.py, verify="meaning"), if a loop shows, or always
    4. the cloud scores [its unseen tokens + the draft] in one forward — on the first escalation
       that is the prompt with the audio, the accepted answer and the draft; a rule decides.
       While a verdict is in flight (a remote cloud), the edge drafts the next block ahead,
       assuming the whole draft is kept and the bonus token is its own choice (`draft_ahead`)
    5. both caches are cut back to the accepted prefix; a block drafted ahead is kept only when
       the verdict is what it assumed, else discarded (edge and generator back where they were)
    6. accepted tokens (+ the recovered / bonus token) join the sequence, stop rules checked per token
    7. one BlockEvent per block goes to the caller

When the cloud fails the clip (unreachable, refusing, an answer that cannot be used, the clip's
deadline missed) and the caller allows it (`fallback`), the edge finishes the clip from where it
stands: the failed block's draft is kept as the edge's own (as an unescalated block is), a block
drafted ahead is discarded, and no later block goes up. The answer is then the verified prefix
followed by the edge's own continuation, under the same rules and generator (`CloudLost` says
where and why).

The loop owns only the accepted sequence and the counters. Each model's tokens and cache live in
its ModelState; the processors and stop rules are the same objects the baselines use.

Drafting ahead is lossless by construction: the block drafted ahead is the very call the blocking
loop makes next (`propose` after the same sequence, on the same edge cache, with the generator in
the same state), and it is used only when the sequence it was drafted after is the sequence the
verdict gives; otherwise the edge is rolled back and the generator restored to where they were
before it, and the next block is drafted as the blocking loop drafts it. There is one place where
an in-flight verdict is awaited (`in_flight.result()`).

Several verdicts in flight (`depth` > 1, issue 43: a cloud that can `submit_ahead`, protocol 3's
remote cloud): a block drafted ahead is also sent ahead, before the verdict it assumes, and the
edge drafts the block after it, up to `depth` verifications in flight. Each assumes the one before
it is kept whole with the edge's bonus guess; the cloud verifies them in order and refuses one whose
assumption is not the session's (no forward run, nothing changed). Verdicts are read in block
order, so the loop still sees the blocking loop's sequence of calls: a verdict that breaks the
assumption discards every block after it (edge and generator back to where the first of them was
drafted; their refusals, still in flight, are collected at the end of the clip and counted by the
cloud), and the loop goes on from the cloud's token. A block whose assumption held but which the
cloud refused anyway (it reached the cloud before the verdict it assumed) is sent again, in turn,
with the random numbers drawn for it when it was first sent (`Refused.resend`).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from transformers import PreTrainedModel

from ..errors import one_line
from .acceptance import Verdict, first_argmax
from .config import DecodingConfig
from .drafter import Drafting, Proposal, propose
from .gate import GateReading, MeaningGate, active, read
from .processors import DecodingRules, VocabMasks
from .state import ModelState
from .verifier import AcceptanceRule, LocalCloud


class Cloud(Protocol):
    """What the loop asks of the cloud (verifier.LocalCloud in this process; a session on a
    `specdec serve` server through remote.client.RemoteCloud): start a clip lazily (or prefill it
    now), verify a draft, roll back to the accepted prefix; plus the work counters a record reports.
    `submit` is `verify` without waiting: the verdict as a future (done at once in this process;
    in flight on a remote cloud). Random numbers a verdict needs are drawn from `generator` in
    `submit` itself, before it returns, so the stream's order does not depend on the link."""

    prefill_tokens: int
    forwards: int
    tokens_fed: int
    all_forwards: int

    def __len__(self) -> int: ...
    def start(self, inputs: Mapping[str, torch.Tensor]) -> None: ...
    def prefill(self, inputs: Mapping[str, torch.Tensor]) -> None: ...
    def verify(self, sequence: list[int], proposal: Proposal, rules: DecodingRules,
               generator: torch.Generator | None, acceptance: AcceptanceRule | None = None) -> tuple[Verdict, int]: ...
    def submit(self, sequence: list[int], proposal: Proposal, rules: DecodingRules, generator: torch.Generator | None,
               acceptance: AcceptanceRule | None = None) -> Future[tuple[Verdict, int]]: ...
    def rollback(self, length: int) -> None: ...


@runtime_checkable
class SendsAhead(Cloud, Protocol):
    """A cloud that can verify a block before the verdict it assumes (protocol 3's remote cloud).
    `submit_ahead(sequence, ...)`: `sequence` ends with the edge's guess of the previous block's
    bonus token, and the request assumes the cloud holds all of it but that guess. Its future gives
    the verdict, or raises `Refused` when the cloud refused it without running it. `discard(f)`: a
    future submitted ahead whose block the loop did not use; waits for it and counts what it cost."""

    def submit_ahead(self, sequence: list[int], proposal: Proposal, rules: DecodingRules,
                     generator: torch.Generator | None) -> Future[tuple[Verdict, int]]: ...
    def discard(self, future: Future[tuple[Verdict, int]]) -> None: ...


class Refused(Exception):  # noqa: N818 (what the cloud did, not an error: the loop sends it again)
    """A block sent ahead that the cloud refused without a forward (protocol 3's out_of_sync, or its
    session not open yet): it reached the cloud before the verdict it assumed, or that verdict was
    not what it assumed. The loop reads it only in the first case (in the second the block is
    discarded) and calls `resend()`: the same request, sent now in turn, with the random numbers
    drawn for it the first time (drawing again would change the generator's stream)."""

    def __init__(self, resend: Callable[[], Future[tuple[Verdict, int]]]) -> None:
        super().__init__("a verification sent ahead was refused before any forward")
        self.resend = resend


@dataclass
class BlockEvent:
    index: int
    draft: list[int]                   # token ids the edge proposed
    entropies: list[float]             # nats, per draft token
    uncertainty: float                 # sum / max / mean of entropies
    escalated: bool
    reason: str                        # "entropy" | "meaning" | "loop" | "always" | "" (not escalated)
    accepted: int                      # draft tokens kept
    correction: int | None = None      # the cloud's recovered or bonus token
    correction_kind: str | None = None  # "recovered" | "bonus"
    cloud_tokens: int = 0              # tokens fed to the cloud for this block, after the prompt
    cloud_prefill_tokens: int = 0      # prompt tokens the cloud ran for this block (lazy prefill)
    answer: list[int] = field(default_factory=list)  # answer ids after this block
    done: bool = False
    # Why the block stayed or went up (the trace and the plot show it): the gate that read it
    # ("entropy" or "meaning"), the score it compared and the threshold it compared it with (up
    # when score > limit, unless a loop or verify=always decided), and the meaning gate's
    # per-token scores (None without it).
    gate: str = "entropy"
    score: float | None = None
    limit: float | None = None
    meaning: list[float] | None = None
    # The cloud failed this block's verification and the edge went on alone: the failure's word
    # (a cloud exception's `cloud_failure`: "unreachable", "deadline"…); its draft is kept unverified.
    fallback: str | None = None


@dataclass
class CloudLost:
    """Where and why the edge finished a clip alone: the cloud's failure (`failure`: the word its
    exception names in `cloud_failure`; `error`: its one line), the answer's length when the edge
    went on alone (`at`), and its length through the cloud's last verdict (`verified`: the tokens
    the cloud had checked, its own corrections included; 0 when it gave none)."""

    failure: str
    error: str
    at: int
    verified: int


def cloud_failure(exc: BaseException) -> str | None:
    """The word a cloud failure names (its class's `cloud_failure`: remote/client.py), or None for
    anything else (a bug, Ctrl-C), which the edge must never paper over."""
    word = getattr(exc, "cloud_failure", None)
    return word if isinstance(word, str) else None


@dataclass
class DecodeStats:
    tokens: int = 0
    blocks: int = 0
    drafted_tokens: int = 0            # edge draft tokens proposed
    accepted_tokens: int = 0           # of those, kept
    verified_drafted: int = 0          # draft tokens in escalated blocks
    verified_accepted: int = 0         # of those, accepted by the cloud
    escalations: int = 0
    loop_escalations: int = 0
    # Cloud work. "After prefill" means after the prompt: a lazy prefill's forward also carries the
    # answer and the first draft, and counts as a cloud call (the edge asked) feeding those tokens.
    cloud_calls: int = 0               # cloud forwards that fed tokens after the prompt
    cloud_tokens: int = 0              # tokens fed to the cloud after the prompt
    cloud_prefill_tokens: int = 0      # prompt tokens the cloud ran (0: the cloud never ran)
    cloud_work_forwards: int = 0       # every cloud forward, the prefill included
    edge_forwards: int = 0             # edge forwards after prefill

    @property
    def cloud_work_tokens(self) -> int:
        """Every token the cloud ran for the clip: its prefill plus what was fed after."""
        return self.cloud_prefill_tokens + self.cloud_tokens

    def observe(self, event: BlockEvent) -> None:
        self.blocks += 1
        self.drafted_tokens += len(event.draft)
        self.accepted_tokens += event.accepted
        if event.escalated:
            self.escalations += 1
            self.loop_escalations += event.reason == "loop"
        if event.escalated and event.fallback is None:  # a block the cloud failed was not verified
            self.verified_drafted += len(event.draft)
            self.verified_accepted += event.accepted

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted over escalated blocks (None when nothing was verified)."""
        return self.verified_accepted / self.verified_drafted if self.verified_drafted else None


@dataclass
class DecodeResult:
    tokens: list[int]                  # the answer's token ids
    stats: DecodeStats
    events: list[BlockEvent] = field(default_factory=list)
    lost: CloudLost | None = None      # the cloud failed and the edge finished the clip alone


def block_uncertainty(entropies: list[float], how: str) -> float:
    if how == "max":
        return max(entropies)
    if how == "mean":
        return sum(entropies) / len(entropies)
    return sum(entropies)


def gate_reading(cfg: DecodingConfig, proposal: Proposal, held: bool = False) -> GateReading:
    """The gate's reading of a block: the meaning gate's when the proposal carries meaning scores
    (the loop computes them only when a gate fitted on this task is active), else the entropy
    gate's. `held`: whether the cloud already holds the clip (the meaning gate's threshold then is
    cfg.gate_verify, not cfg.gate_upload)."""
    return read(cfg, proposal.entropies, proposal.meaning, held)


def escalation_reason(cfg: DecodingConfig, proposal: Proposal, answer: list[int], held: bool = False) -> str:
    """Why this block goes to the cloud, or "" if it does not. A threshold of +inf means the cloud
    is never consulted (edge-only through this loop); otherwise a detected loop escalates whatever
    the entropy, because a looping edge is often confident (F11). Then the gate: "entropy" or
    "meaning" when the block's score exceeds its threshold (gate_reading)."""
    if cfg.verify == "always":
        return "always"
    if cfg.threshold == float("inf"):
        return ""
    # The loop test is the drafter's `proposal.loop` (DecodingRules.shows_loop): a draft token
    # completes a tandem repeat of the answer's characters (unit >= 2: 音色中音色中) or of token ids
    # (unit >= 1: x y x y), seen across block boundaries since history and draft are one sequence
    # (F10). Tandem, not "an n-gram seen before": descriptions repeat 适中 and 音 at a distance.
    if cfg.constraints and proposal.loop:
        return "loop"
    reading = gate_reading(cfg, proposal, held)
    return reading.gate if reading.score > reading.limit else ""


def speculative_decode(
    edge_model: PreTrainedModel,
    cloud_model: PreTrainedModel | Cloud,
    inputs: Mapping[str, torch.Tensor],
    cfg: DecodingConfig,
    masks: VocabMasks,
    eos_ids: list[int],
    on_block: Callable[[BlockEvent], None] | None = None,
    lazy_prefill: bool = True,
    acceptance: AcceptanceRule | None = None,
    gate: MeaningGate | None = None,
    fallback: bool = False,
    depth: int = 1,
) -> DecodeResult:
    """Decode one clip. With `lazy_prefill` (the default) the cloud runs nothing until the first
    escalation, so a clip the edge handles alone costs the cloud nothing and never leaves the
    device; `lazy_prefill=False` prefills the cloud up front (same tokens, more cloud work).
    `acceptance` replaces the greedy rule (bench/synthetic.py's accept-with-probability-alpha);
    None: greedy match, or rejection sampling with `cfg.sample`. `cloud_model` is a model (scored
    in this process) or a `Cloud` for this clip (e.g. a session on a remote server). `gate`: the
    pair's meaning gate, used when cfg.verify is "meaning" and it was fitted on cfg's task (else
    the entropy gate decides). `fallback`: when the cloud fails (an exception naming its
    `cloud_failure`), the edge finishes the clip alone (`DecodeResult.lost` says so) instead of
    the failure ending the clip. `depth`: at most this many verifications in flight (> 1 only with
    a cloud that `SendsAhead`; 1: one verdict in flight, the next block drafted but not sent)."""
    generator = torch.Generator().manual_seed(cfg.seed) if cfg.sample else None
    edge = ModelState(edge_model, "edge")
    cloud: Cloud = LocalCloud(cloud_model) if isinstance(cloud_model, torch.nn.Module) else cloud_model

    # 1. The edge hears the clip now; the cloud keeps the same prompt and hears it when first asked.
    edge.prefill(inputs)
    if lazy_prefill:
        cloud.start(inputs)
    else:
        cloud.prefill(inputs)
    prompt_len = len(edge)
    rules = DecodingRules.build(cfg, masks, prompt_len, eos_ids)
    meaning = active(cfg, gate)
    sequence = list(edge.ids)          # prompt + accepted answer: the one sequence of record
    stats = DecodeStats()
    events: list[BlockEvent] = []

    done = False
    ahead: Ahead | None = None         # the next block, drafted while the last verdict was in flight
    sent: deque[Sent] = deque()        # blocks sent ahead (depth > 1), oldest first; `ahead` follows them
    dropped: list[Future] = []         # verifications of blocks discarded, maybe still in flight
    if not isinstance(cloud, SendsAhead):
        depth = 1
    pays = AheadPays()

    def discard_ahead() -> None:
        """Every block drafted or sent after the verdict just read is undone: the edge and the
        generator go back to where the first of them was drafted (the later ones were drafted
        after it, so that one rollback undoes them all)."""
        nonlocal ahead
        first = sent[0].ahead if sent else ahead
        if first is not None:
            first.discard(edge, generator)
        dropped.extend(s.future for s in sent)
        sent.clear()
        ahead = None

    def fill(in_flight: Future[tuple[Verdict, int]]) -> None:
        """While the verdict read next is in flight: draft the next block ahead (after the last
        block sent, assuming it kept whole) and, up to `depth` in flight, send it too when the gate
        sends it up (held: the cloud holds the clip by then). With depth 1 this drafts one block,
        as the one-verdict loop always did."""
        nonlocal ahead
        while not in_flight.done():
            if ahead is None:
                last_sequence, last_proposal, last_future = ((sent[-1].ahead.sequence, sent[-1].ahead.proposal,
                                                              sent[-1].future) if sent else
                                                             (sequence, proposal, in_flight))
                if last_future.done():  # its verdict is in: the loop reads it before drafting on
                    return
                ahead = draft_ahead(edge, last_sequence, last_proposal, last_future, cfg, rules, generator, meaning)
                if ahead is None:
                    return
            if 1 + len(sent) >= depth:
                return
            why = escalation_reason(cfg, ahead.proposal, ahead.sequence[prompt_len:], True)
            if not why:  # the gate keeps it on the edge: it waits, drafted, for the verdict before it
                return
            assert isinstance(cloud, SendsAhead)
            future = pays.watch(cloud.submit_ahead(ahead.sequence, ahead.proposal, rules, generator))
            sent.append(Sent(ahead, future, why))
            ahead = None
    lost: CloudLost | None = None      # set when the cloud failed: the edge goes on alone
    verified = 0                       # answer tokens through the cloud's last verdict
    while not done:
        # 2. Draft up to k tokens, never past max_new_tokens (or take the block drafted ahead: it
        #    was drafted after this very sequence).
        #    A block sent ahead was drafted and gated after this very sequence too, and its
        #    verification is in flight already.
        ahead_sent = sent.popleft() if sent else None
        if ahead_sent is not None:
            proposal = ahead_sent.ahead.proposal
        elif ahead is not None:
            proposal, ahead = ahead.proposal, None
        else:
            with pays.drafting():
                proposal = propose(edge, sequence, next_budget(cfg, prompt_len, sequence), rules, generator, meaning)
        answer = sequence[prompt_len:]

        # 3. Gate.
        held = cloud.prefill_tokens > 0 or ahead_sent is not None
        if ahead_sent is not None:
            reason = ahead_sent.reason
        else:
            reason = "" if lost is not None else escalation_reason(cfg, proposal, answer, held)
        event = new_event(len(events), cfg, proposal, reason, held)
        new_tokens = list(proposal.tokens)

        if reason:
            # 4. Verify: one cloud forward over its unseen tokens + the draft (k+1 rows, each
            #    processed by the rules when the verdict first reads it: none past the first
            #    rejection), then the rule: greedy match, or rejection sampling with the generator.
            #    While the verdict is in flight, the edge drafts the next block ahead.
            prefilled = cloud.prefill_tokens
            if ahead_sent is not None:
                in_flight = ahead_sent.future
            else:
                in_flight = pays.watch(cloud.submit(sequence, proposal, rules, generator, acceptance))
            if not in_flight.done() and pays.now():
                fill(in_flight)
            try:
                while True:
                    try:
                        verdict, fed = in_flight.result()  # the one place an in-flight verdict is awaited
                        break
                    except Refused as refused:
                        # Sent ahead, refused unrun, and its assumption held (this is its turn): again,
                        # now. A resend is an ordinary verification and never raises Refused.
                        in_flight = pays.watch(refused.resend())
            except Exception as exc:
                failure = cloud_failure(exc)
                if not fallback or failure is None:
                    raise
                # The edge goes on alone from the sequence the verdicts made: this block's draft is
                # its own (as an unescalated block's), a block drafted ahead after it is undone.
                discard_ahead()
                lost = CloudLost(failure, one_line(exc), len(answer), verified)
                event.fallback = failure
            else:
                new_tokens = proposal.tokens[:verdict.accepted] + [verdict.token]
                event.accepted, event.correction, event.correction_kind = verdict.accepted, verdict.token, verdict.kind
                event.cloud_tokens, event.cloud_prefill_tokens = fed, cloud.prefill_tokens - prefilled

                # 5. Roll both caches back to the accepted prefix (the edge may hold less already). A
                #    block drafted ahead after another sequence than the verdict's is discarded first.
                following = sent[0].ahead if sent else ahead
                if following is not None and following.sequence != sequence + new_tokens:
                    discard_ahead()
                keep = len(sequence) + verdict.accepted
                if not sent and ahead is None:
                    edge.rollback(min(len(edge), keep))
                cloud.rollback(keep)
                verified = len(answer) + len(new_tokens)

        # 6. Extend the sequence token by token; the first token that ends generation ends it.
        done = extend(sequence, new_tokens, rules)

        # 7. Report.
        event.answer = sequence[prompt_len:]
        event.done = done
        stats.observe(event)
        events.append(event)
        if on_block is not None:
            on_block(event)

    if sent or ahead is not None:  # (none is left at the end as the loop runs: kept safe all the same)
        discard_ahead()
    # The verifications of discarded blocks: their refusals (or, were one run, its forwards) are
    # counted by the cloud before the clip's counts are read; each request has its deadline.
    for future in dropped:
        assert isinstance(cloud, SendsAhead)
        cloud.discard(future)
    stats.tokens = len(sequence) - prompt_len
    count_work(stats, edge, cloud)
    return DecodeResult(sequence[prompt_len:], stats, events, lost)


class AheadPays:
    """Whether drafting ahead is worth starting: only while the clip's last verdict took longer
    than the edge's last block took to draft (the first time: yes). On a fast link with a slow
    edge, drafting ahead would only hold up the loop, and take the CPU from a cloud on the same
    machine; tokens are the same either way, this decides time only."""

    def __init__(self) -> None:
        self.draft_s = 0.0                    # the last block drafted in line, start to end
        self.verdict_s = float("inf")         # the last verdict, submitted to done

    @contextlib.contextmanager
    def drafting(self) -> Iterator[None]:
        started = time.perf_counter()
        yield
        self.draft_s = time.perf_counter() - started

    def watch(self, in_flight: Future) -> Future:
        started = time.perf_counter()
        in_flight.add_done_callback(lambda _f: setattr(self, "verdict_s", time.perf_counter() - started))
        return in_flight

    def now(self) -> bool:
        return self.verdict_s > self.draft_s


def next_budget(cfg: DecodingConfig, prompt_len: int, sequence: list[int]) -> int:
    """The next block's length: k, never past max_new_tokens."""
    return min(cfg.k, prompt_len + cfg.max_new_tokens - len(sequence))


@dataclass
class Ahead:
    """A block drafted while the previous block's verdict was in flight, after `sequence`: the
    previous sequence, its whole draft, and the edge's own choice for the token after it (the
    bonus the cloud adds when it keeps the whole draft)."""

    sequence: list[int]
    proposal: Proposal
    edge_held: int                     # tokens the edge held before drafting ahead
    rng: torch.Tensor | None           # the generator's state before drafting ahead

    def discard(self, edge: ModelState, generator: torch.Generator | None) -> None:
        """The verdict was not what this block assumed: the edge and the generator go back to
        where they were before it was drafted (the edge by its one rollback). Returns None, what
        the loop then holds ahead."""
        edge.rollback(self.edge_held)
        if generator is not None and self.rng is not None:
            generator.set_state(self.rng)
        return None


@dataclass
class Sent:
    """A block drafted ahead and sent ahead: its verification is in flight (`future`), and the
    gate's reason for sending it up."""

    ahead: Ahead
    future: Future[tuple[Verdict, int]]
    reason: str


def draft_ahead(edge: ModelState, sequence: list[int], proposal: Proposal, in_flight: Future[tuple[Verdict, int]],
                cfg: DecodingConfig, rules: DecodingRules, generator: torch.Generator | None,
                meaning: MeaningGate | None) -> Ahead | None:
    """The next block as the blocking loop would draft it if the verdict on `proposal` keeps the
    whole draft and its bonus token is the edge's choice there (greedy even when sampling: the
    guess draws nothing). None when there is no next block on that assumption (the draft or the
    guess ends the clip), or when the verdict arrived while drafting and broke the assumption (the
    drafting stops there, the edge and the generator are put back: no time is spent on a block
    that cannot be used).

    The guess needs the edge's logits after the whole draft: one forward of the draft's last
    token, then cut again, so that the block drafted after the guess starts with the same
    catch-up forward ([last draft token, bonus]) as the blocking loop's, and every row is computed
    exactly as there."""
    held = len(edge)
    assumed = sequence + proposal.tokens
    if rules.stops(assumed):
        return None
    scores = rules.process_ids(assumed, edge.logits_after(assumed), warp=False)
    guess = first_argmax(scores)
    edge.rollback(held)
    after = assumed + [guess]
    if rules.stops(after):
        return None

    def overtaken() -> bool:
        """The verdict is in, and it is not the one assumed."""
        if not in_flight.done():
            # Hand the GIL over for a moment: the threads carrying the verdict (the client's
            # event loop, its verification thread) would otherwise wait up to the interpreter's
            # switch interval (5 ms) at each of their steps while the edge drafts.
            time.sleep(0)
            return False
        if in_flight.exception() is not None:
            return True
        verdict, _ = in_flight.result()
        return (verdict.accepted, verdict.token) != (len(proposal.tokens), guess)

    ahead = Ahead(after, proposal, held, generator.get_state() if generator is not None else None)
    # propose()'s steps, with a look at the verdict before each edge forward.
    drafting = Drafting(after, next_budget(cfg, rules.prompt_len, after), rules, generator, meaning)
    feed = None if overtaken() else drafting.step(edge.logits_after(after))
    while feed is not None and not overtaken():
        feed = drafting.step(edge.advance([feed])[-1])
    if feed is not None or overtaken():
        return ahead.discard(edge, generator)
    ahead.proposal = drafting.proposal()
    return ahead


def new_event(index: int, cfg: DecodingConfig, proposal: Proposal, reason: str, held: bool) -> BlockEvent:
    """A block's event before the cloud's verdict: the draft, the gate's reading, the decision."""
    reading = gate_reading(cfg, proposal, held)
    return BlockEvent(index, proposal.tokens, proposal.entropies,
                      block_uncertainty(proposal.entropies, cfg.uncertainty), bool(reason), reason,
                      accepted=len(proposal.tokens), gate=reading.gate, score=reading.score, limit=reading.limit,
                      meaning=proposal.meaning)


def extend(sequence: list[int], tokens: list[int], rules: DecodingRules) -> bool:
    """Append `tokens` one by one; True (and no further token) at the first that ends generation."""
    for token in tokens:
        sequence.append(token)
        if rules.stops(sequence):
            return True
    return False


def count_work(stats: DecodeStats, edge, cloud) -> None:
    """A clip's model work into its stats, from the work counters of its edge and cloud states
    (ModelState, LocalCloud, a BatchState row: `forwards`, `tokens_fed`, `prefill_tokens`,
    `all_forwards`; cloud None: it never ran for the clip)."""
    if cloud is not None:
        stats.cloud_calls, stats.cloud_tokens = cloud.forwards, cloud.tokens_fed
        stats.cloud_prefill_tokens, stats.cloud_work_forwards = cloud.prefill_tokens, cloud.all_forwards
    stats.edge_forwards = edge.forwards
