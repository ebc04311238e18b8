"""The meaning gate (issue 26): a wording block stays on the edge, a meaning block goes up; the
lossless modes hold with the gate on; the gate is deterministic and reads what an independent full
forward gives; another task falls back to the entropy gate; the fit and the objective against
hand-computed answers; the presets table round-trips.

Oracles: HF `generate` (cloud-only / edge-only), an uncached forward over the answer with the gate's
formula computed densely over the whole vocabulary, a toy table model whose probabilities are set
by hand, the cubic a two-token fit must solve, hand-computed cost tables, tomllib.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import clip
from toy import TableLM

from specdec_cli.calibration_objective import (
    ClipCost,
    SettingScore,
    cheapest,
    choose,
    quality_gap,
    score_clips,
    share_first_key,
)
from specdec_cli.decoding import DecodingConfig, VocabMasks, generate_baseline, speculative_decode
from specdec_cli.decoding.batch_loop import speculative_decode_batch
from specdec_cli.decoding.gate import DEFAULT_INSTRUCTION, DEFAULT_SYSTEM, MeaningGate
from specdec_cli.decoding.processors import DecodingRules
from specdec_cli.errors import InputError
from specdec_cli.gate_fit import Swap, fit_weights, gate_from_swaps, swap_labels, sweep, text_outcome
from specdec_cli.gate_presets import gate_toml, load_gate, parse_gate, preset_gate_lines

# -- a toy pair whose probabilities are set by hand -----------------------------------------------

TOY = ["<eos>", "x", "说", "人", "是", "声", "高", "低", "。", "z"]
ID = {t: i for i, t in enumerate(TOY)}
TOY_MASKS = VocabMasks.from_texts(TOY, len(TOY))
TOY_INPUTS = {"input_ids": torch.tensor([[ID["x"]]]), "attention_mask": torch.ones(1, 1, dtype=torch.long)}


def _toy_pair() -> tuple[TableLM, TableLM]:
    """The edge writes 说 → {人 | 是} → 声 → {高 | 低} → 。→ <eos>, even odds at the two forks: after
    说 the choice is wording (人 / 是, the same sentence either way), after 声 it is what the sentence
    says (高 / 低). The cloud says 说是声低。"""
    edge, cloud = TableLM(len(TOY)), TableLM(len(TOY))
    for lm in (edge, cloud):
        lm.set(ID["x"], ID["说"]).set(ID["人"], ID["声"]).set(ID["是"], ID["声"])
        lm.set(ID["高"], ID["。"]).set(ID["低"], ID["。"]).set(ID["。"], ID["<eos>"])
    edge.table[ID["说"]] = 0.0
    edge.table[ID["说"], [ID["人"], ID["是"]]] = 12.0
    edge.table[ID["声"]] = 0.0
    edge.table[ID["声"], [ID["高"], ID["低"]]] = 12.0
    cloud.set(ID["说"], ID["是"]).set(ID["声"], ID["低"])
    return edge, cloud


WORDING_GATE = MeaningGate({ID["人"]: 0.0, ID["是"]: 0.0})  # 人/是 carry no meaning; every other id: 1
TOY_CFG = DecodingConfig(k=2, max_new_tokens=8, constraints=False, verify="meaning", threshold=0.5,
                         gate_upload=0.3, gate_verify=0.3)


def test_a_wording_block_stays_on_the_edge_and_a_meaning_block_goes_up():
    """The regression (issue 26): the entropy gate sends the wording fork (ln 2 nats on 人/是) to
    the cloud; the meaning gate keeps it on the edge and sends only the 高/低 fork. Before the gate
    there was no way to tell them apart (verify="meaning" did not exist)."""
    edge, cloud = _toy_pair()
    entropy_events, meaning_events = [], []
    by_entropy = speculative_decode(edge, cloud, TOY_INPUTS, TOY_CFG.with_(verify="entropy"), TOY_MASKS, [0],
                                    on_block=entropy_events.append)
    by_meaning = speculative_decode(edge, cloud, TOY_INPUTS, TOY_CFG, TOY_MASKS, [0],
                                    on_block=meaning_events.append, gate=WORDING_GATE)
    assert [e.escalated for e in entropy_events[:2]] == [True, True]
    assert [TOY[t] for t in by_entropy.tokens] == ["说", "是", "声", "低", "。", "<eos>"]  # the cloud's wording

    first, second = meaning_events[0], meaning_events[1]
    assert [TOY[t] for t in first.draft] == ["说", "人"] and not first.escalated
    assert first.gate == "meaning" and first.score < first.limit == 0.3
    assert first.meaning[1] == 0.0                              # 人: a wording token
    assert [TOY[t] for t in second.draft] == ["声", "高"] and second.escalated and second.reason == "meaning"
    assert second.meaning[1] == pytest.approx(0.5, abs=1e-3)    # half the mass on 低, which changes the meaning
    assert second.score == pytest.approx(sum(second.meaning)) and second.score > second.limit
    assert [TOY[t] for t in by_meaning.tokens] == ["说", "人", "声", "低", "。", "<eos>"]  # edge's wording, cloud's 低
    assert by_meaning.stats.escalations == 1


def test_the_first_escalation_uses_gate_upload_and_later_blocks_gate_verify():
    """Before the cloud holds the clip a block is judged against gate_upload, after against
    gate_verify: with gate_upload above the 高/低 fork's score nothing ever goes up; with
    gate_verify = 0 every block after the first escalation is verified."""
    edge, cloud = _toy_pair()
    events = []
    never = speculative_decode(edge, cloud, TOY_INPUTS, TOY_CFG.with_(gate_upload=0.6, gate_verify=0.0), TOY_MASKS,
                               [0], on_block=events.append, gate=WORDING_GATE)
    assert never.stats.cloud_work_forwards == 0 and all(e.limit == 0.6 for e in events)
    events = []
    speculative_decode(edge, cloud, TOY_INPUTS, TOY_CFG.with_(gate_upload=0.3, gate_verify=0.0), TOY_MASKS, [0],
                       on_block=events.append, gate=WORDING_GATE)
    up = next(i for i, e in enumerate(events) if e.escalated)
    assert all(e.limit == 0.3 for e in events[:up + 1])
    assert all(e.limit == 0.0 and e.escalated == (e.score > 0.0) for e in events[up + 1:])
    assert any(e.escalated for e in events[up + 1:])


def test_sampling_reads_the_distribution_before_the_warpers():
    """With --sample and temperature 0.5 the gate, like the entropy, reads the rules' distribution
    before the warpers: each m_j is w[a] times the table row's softmax mass off the drafted token
    (less 人/是, weight 0), at temperature 1, whichever token was drawn."""
    edge, cloud = _toy_pair()
    edge.table[ID["声"], ID["低"]] = 11.0  # 高 e^12 : 低 e^11, so the warped row differs from the plain one
    events = []
    speculative_decode(edge, cloud, TOY_INPUTS, TOY_CFG.with_(sample=True, temperature=0.5, seed=3), TOY_MASKS, [0],
                       on_block=events.append, gate=WORDING_GATE)
    checked = 0
    for e in events:
        before = e.answer[:len(e.answer) - e.accepted - (e.correction is not None)]
        context = [ID["x"], *before, *e.draft]  # the prompt, the answer before the block, the draft
        for j, token in enumerate(e.draft):
            p = torch.softmax(edge.table[context[len(before) + j]].double(), -1)  # a table LM reads one token back
            expected = WORDING_GATE.weight(token) * float(1 - p[token] - p[ID["人"]] - p[ID["是"]]
                                                         + (p[token] if token in (ID["人"], ID["是"]) else 0))
            assert e.meaning[j] == pytest.approx(expected, abs=1e-5)
            checked += 1
    assert checked >= 4 and any(e.meaning and max(e.meaning) > 0.2 for e in events)


def test_another_task_falls_back_to_the_entropy_gate():
    """A gate fitted on the default description task says nothing about another instruction: the
    same decode with another instruction is exactly the entropy gate's (tokens and decisions)."""
    edge, cloud = _toy_pair()
    other = TOY_CFG.with_(instruction="Describe the weather.")
    gated, plain = [], []
    out = speculative_decode(edge, cloud, TOY_INPUTS, other, TOY_MASKS, [0], on_block=gated.append, gate=WORDING_GATE)
    ref = speculative_decode(edge, cloud, TOY_INPUTS, other.with_(verify="entropy"), TOY_MASKS, [0],
                             on_block=plain.append)
    assert out.tokens == ref.tokens
    assert [(e.escalated, e.reason, e.gate, e.score, e.limit) for e in gated] == \
        [(e.escalated, e.reason, e.gate, e.score, e.limit) for e in plain]
    assert all(e.gate == "entropy" and e.meaning is None for e in gated) and gated[0].escalated
    # Fitted on that task, it applies.
    fitted = MeaningGate(WORDING_GATE.weights, instruction="Describe the weather.")
    assert fitted.applies(other) and not fitted.applies(TOY_CFG) and WORDING_GATE.applies(TOY_CFG)
    assert not MeaningGate({}, tokenizer="abc").applies(TOY_CFG, tokenizer="xyz")


def test_the_default_task_is_prompt_py_s():
    from specdec_cli.prompt import INSTRUCTION, SYSTEM

    assert (DEFAULT_INSTRUCTION, DEFAULT_SYSTEM) == (INSTRUCTION, SYSTEM)


# -- the lossless modes and determinism on the random thinker pair ---------------------------------

SEEDS = range(6)


def _gate_for(masks: VocabMasks, seed: int = 0) -> MeaningGate:
    """Random weights on a third of the vocabulary (a gate that scores something on every block)."""
    rng = np.random.default_rng(seed)
    ids = rng.choice(masks.n_text, masks.n_text // 3, replace=False)
    return MeaningGate({int(t): float(w) for t, w in zip(ids, rng.uniform(0, 1, ids.size), strict=True)})


@pytest.mark.parametrize("constraints", [True, False], ids=["constraints-on", "constraints-off"])
def test_lossless_modes_hold_with_the_gate_on(edge, cloud, processor, masks, eos_ids, constraints):
    """verify=always with a gate given = cloud-only greedy; threshold=inf with verify=meaning =
    edge-only greedy; and verify=meaning with both thresholds 0 and every weight 1 verifies every
    block (each has some mass off the drafted token), so it is cloud-only too."""
    gate, ones = _gate_for(masks), MeaningGate({})
    for seed in SEEDS:
        inputs = processor(clip(seed, 0.6 + 0.1 * (seed % 4)))
        cfg = DecodingConfig(k=(2, 3, 5)[seed % 3], max_new_tokens=20, constraints=constraints)
        cloud_only = generate_baseline(cloud, inputs, cfg.with_(mode="cloud"), masks, eos_ids).tokens
        edge_only = generate_baseline(edge, inputs, cfg.with_(mode="edge"), masks, eos_ids).tokens
        always = speculative_decode(edge, cloud, inputs, cfg.with_(verify="always"), masks, eos_ids, gate=gate)
        never = speculative_decode(edge, cloud, inputs, cfg.with_(verify="meaning", threshold=math.inf), masks,
                                   eos_ids, gate=gate)
        every = speculative_decode(edge, cloud, inputs, cfg.with_(verify="meaning", gate_upload=0.0, gate_verify=0.0),
                                   masks, eos_ids, gate=ones)
        assert always.tokens == cloud_only and every.tokens == cloud_only
        assert never.tokens == edge_only and never.stats.cloud_work_forwards == 0
        assert every.stats.escalations == every.stats.blocks  # the premise: every block was verified


def test_meaning_scores_match_a_full_forward_and_are_deterministic(edge, cloud, processor, masks, eos_ids):
    """Each draft token's m_j equals the gate's formula computed densely over the whole vocabulary
    on the distribution an uncached forward over prompt + answer gives (processed by the rules);
    two runs give the same events; the batched loop gives the same scores and decisions."""
    gate = _gate_for(masks, 1)
    w = torch.ones(masks.vocab_size, dtype=torch.float64)
    for t, x in gate.weights.items():
        w[t] = x
    cfg = DecodingConfig(k=4, max_new_tokens=16, verify="meaning", gate_upload=1.2, gate_verify=0.6)
    for seed in (0, 3):
        inputs = processor(clip(seed))
        runs = [[], []]
        for events in runs:
            speculative_decode(edge, cloud, inputs, cfg, masks, eos_ids, on_block=events.append, gate=gate)
        assert [(e.draft, e.meaning, e.escalated, e.score, e.limit) for e in runs[0]] == \
            [(e.draft, e.meaning, e.escalated, e.score, e.limit) for e in runs[1]]
        batched = []
        list(speculative_decode_batch(edge, cloud, [("a", inputs)], cfg, masks, eos_ids, 2, gate=gate,
                                      on_block=lambda _k, e, out=batched: out.append(e)))
        assert [(e.draft, e.escalated, e.limit) for e in batched] == [(e.draft, e.escalated, e.limit) for e in runs[0]]
        for a, b in zip(batched, runs[0], strict=True):
            assert a.meaning == pytest.approx(b.meaning, abs=1e-5)

        # The oracle: one uncached forward over the prompt and every drafted token of every block.
        prompt = inputs["input_ids"][0].tolist()
        rules = DecodingRules.build(cfg, masks, len(prompt), eos_ids)
        for e in runs[0]:
            before = e.answer[:len(e.answer) - e.accepted - (e.correction is not None)]
            ids = prompt + before + e.draft
            full = dict(inputs, input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long))
            edge.model.rope_deltas = None
            with torch.inference_mode():
                logits = edge(**full, use_cache=False).logits[0, len(prompt) + len(before) - 1:-1].float()
            for j, token in enumerate(e.draft):
                p = torch.softmax(rules.process_ids(ids[:len(prompt) + len(before) + j], logits[j], warp=False),
                                  dim=-1).double()
                wp = p * w[:p.shape[0]]
                dense = float(w[token] * (wp.sum() - wp[token]))
                assert e.meaning[j] == pytest.approx(dense, abs=1e-4)


def test_scorer_at_the_real_width_equals_the_dense_formula():
    """The sparse gather (ids whose weight differs from the default) against Σ p·w over a
    152,064-row distribution, for a drafted token that is listed and one that is not."""
    rng = np.random.default_rng(7)
    width = 152_064
    ids = rng.choice(151_665, 400, replace=False)
    gate = MeaningGate({int(t): float(x) for t, x in zip(ids, rng.uniform(0, 1, 400), strict=True)}, default=0.8)
    w = np.full(width, 0.8)
    w[ids] = [gate.weights[int(t)] for t in ids]
    for token in (int(ids[5]), 12345 if 12345 not in gate.weights else 12346):
        logits = rng.normal(0, 3, width)
        logits[token] = logits.max() + 12.0  # the drafted token holds most of the mass, as a draft does
        p = np.exp(logits - logits.max())
        p /= p.sum()
        dense = w[token] * (np.dot(p, w) - p[token] * w[token])
        assert gate.score(p.astype(np.float32), token) == pytest.approx(dense, rel=1e-5, abs=1e-7)
    assert gate.scorer(width) is gate.scorer(width)  # built once per width


# -- fitting ----------------------------------------------------------------------------------------

def test_swap_labels_on_a_hand_made_pair():
    """On the toy edge the only likely alternatives are 是 for 人 (p = 1/2, the sentence then says the
    same: the outcome below reads only 高/低) and 低 for 高 (p = 1/2, it says something else)."""
    edge, _ = _toy_pair()
    # The wording fork a little less sure than the meaning fork (logits 10 against 12: p 0.49991 against
    # 0.49999), so which alternative is likelier does not rest on the last bit of a float32 softmax
    # (with both at 12 they differed by 6e-8, and the order flipped between machines).
    edge.table[ID["说"], [ID["人"], ID["是"]]] = 10.0
    cfg = DecodingConfig(max_new_tokens=8, constraints=False)
    answer = speculative_decode(edge, edge, TOY_INPUTS, cfg.with_(threshold=math.inf), TOY_MASKS, [0]).tokens
    assert [TOY[t] for t in answer] == ["说", "人", "声", "高", "。", "<eos>"]
    swaps = swap_labels(edge, TOY_INPUTS, answer, cfg, TOY_MASKS, [0],
                        lambda ids: tuple(TOY[t] for t in ids if TOY[t] in ("高", "低")))
    got = [(TOY[s.drafted], TOY[s.alternative], round(s.p, 3), s.changed) for s in swaps]
    assert got == [("人", "是", 0.5, False), ("高", "低", 0.5, True)]
    # max_swaps keeps the likeliest alternatives (here 低 for 高), labelled the same way
    bounded = swap_labels(edge, TOY_INPUTS, answer, cfg, TOY_MASKS, [0],
                          lambda ids: tuple(TOY[t] for t in ids if TOY[t] in ("高", "低")), max_swaps=1)
    assert bounded == [max(swaps, key=lambda s: s.p)] == swaps[1:]
    assert swap_labels(edge, TOY_INPUTS, answer, cfg, TOY_MASKS, [0],
                       lambda ids: tuple(TOY[t] for t in ids if TOY[t] in ("高", "低")), max_swaps=2) == swaps
    assert swap_labels(edge, TOY_INPUTS, answer, cfg, TOY_MASKS, [0], lambda ids: 0, max_swaps=0) == []


def test_fit_weights_solves_the_hand_computed_fixed_points():
    """Two swaps: 人↔是 never changes the outcome, 高↔低 always does. With prior λ the fit's fixed
    point for the pair that never changes solves w = λ / (λ + n·w²) (n swaps), i.e. n·w³ + λ·w - λ = 0
    (λ = 1, n = 1: w ≈ 0.6823; n = 3: w ≈ 0.5366); the pair that always changes stays at 1."""
    for n in (1, 3):
        swaps = [Swap(3, 4, 0.5, False)] * n + [Swap(6, 7, 0.5, True)] * n
        w = fit_weights(swaps, prior=1.0)
        roots = np.roots([n, 0.0, 1.0, -1.0])
        expected = float(next(r.real for r in roots if abs(r.imag) < 1e-12 and 0 < r.real < 1))
        assert w[3] == pytest.approx(expected, abs=1e-4) and w[4] == pytest.approx(expected, abs=1e-4)
        assert w[6] == w[7] == 1.0
    gate = gate_from_swaps(swaps, DecodingConfig(), tokenizer="fp")
    assert set(gate.weights) == {3, 4} and gate.tokenizer == "fp" and gate.instruction == DEFAULT_INSTRUCTION
    assert fit_weights([]) == {}


def test_the_sweep_grid_by_hand():
    """Block scores 0..10: gate_upload at the 50/60/70/80/85/90/95th percentiles (5, 6, 7, 8, 8.5, 9,
    9.5) and inf; gate_verify at 0, the 10/25/50/75th (1, 2.5, 5, 7.5) and gate_upload itself, never
    above gate_upload, and not the edge-only inf/inf. Per upload: 5 -> 0, 1, 2.5, 5 (4); 6, 7 -> the
    same + itself (5 each); 8, 8.5, 9, 9.5 -> 0, 1, 2.5, 5, 7.5 + itself (6 each); inf -> 0, 1, 2.5,
    5, 7.5 (5): 4 + 10 + 24 + 5 = 43."""
    grid = sweep(DecodingConfig(), 8, [float(x) for x in range(11)])
    pairs = [(c.gate_upload, c.gate_verify) for c in grid]
    assert len(pairs) == 43 == len(set(pairs))
    assert all(c.k == 8 and c.verify == "meaning" for c in grid)
    assert {u for u, _ in pairs} == {5.0, 6.0, 7.0, 8.0, 8.5, 9.0, 9.5, math.inf}
    assert {v for _, v in pairs} == {0.0, 1.0, 2.5, 5.0, 6.0, 7.0, 7.5, 8.0, 8.5, 9.0, 9.5}
    assert all(v <= u for u, v in pairs) and (5.0, 7.5) not in pairs and (math.inf, 7.5) in pairs
    assert all((u, u) in pairs for u in (5.0, 6.0, 9.5))


def test_text_outcome_reads_what_the_sentence_says():
    assert text_outcome("说话人是女声，语速较快。") == text_outcome("说话者为女声，语速较快。")
    assert text_outcome("说话人是女声，语速较快。") != text_outcome("说话人是女声，语速较慢。")
    assert text_outcome("他的声音") == "他的声音"  # no phrase: the text itself


# -- the objective ----------------------------------------------------------------------------------

def test_score_clips_on_a_hand_computed_table():
    clips = [ClipCost(1.0, 20, 0, 0, 0, 0), ClipCost(5 / 6, 30, 3, 4, 250, 90_000),
             ClipCost(2 / 3, 50, 5, 6, 310, 110_000), ClipCost(1.0, 0, 0, 0, 0, 0)]
    s = score_clips(clips)
    assert s.quality == pytest.approx(100 * (1 + 5 / 6 + 2 / 3 + 1) / 4)
    assert s.call_rate == pytest.approx(8 / 100)
    assert (s.up_share, s.zero_cloud_share) == (0.5, 0.5)
    assert s.work_per_clip == pytest.approx(560 / 4) and s.bytes_per_clip == pytest.approx(200_000 / 4)


def test_cheapest_counts_the_clouds_work_per_clip():
    """Cloud-only 98 points; target 97. B makes fewer calls per token than A, but every clip of B
    goes up and pays its prefill (260 work tokens per clip against A's 200): A wins. C is cheapest
    of all but 2 points down. Share first, A again (a quarter of its clips stay home); with a
    call-rate cap below A's, B. With nothing in reach: the best quality, flagged."""
    table = [("A", SettingScore(97.5, 0.12, 0.75, 200.0, 0.0)), ("B", SettingScore(97.8, 0.09, 1.0, 260.0, 0.0)),
             ("C", SettingScore(96.0, 0.05, 0.5, 120.0, 0.0)), ("D", SettingScore(96.5, 0.11, 0.6, 160.0, 0.0))]
    assert cheapest(table, 97.0)[::2] == ("A", True)
    assert cheapest(table, 97.0, key=share_first_key)[::2] == ("A", True)
    assert cheapest(table, 97.0, max_call_rate=0.10)[::2] == ("B", True)
    assert cheapest(table, 96.0)[::2] == ("C", True)
    assert cheapest(table, 99.0)[::2] == ("B", False)
    # Work ties: fewer calls first; work and calls tie: the earlier.
    tie = [("first", SettingScore(97.0, 0.1, 0.5, 9.0, 0.0)), ("second", SettingScore(97.0, 0.1, 0.5, 9.0, 0.0)),
           ("fewer calls", SettingScore(96.0, 0.08, 0.9, 9.0, 0.0))]
    assert cheapest(tie, 90.0)[0] == "fewer calls" and cheapest(tie[:2], 90.0)[0] == "first"
    with pytest.raises(ValueError):
        cheapest([], 90.0)


def _clips(qualities: list[float], work: int) -> list[ClipCost]:
    return [ClipCost(q, 10, 1 if work else 0, 1 if work else 0, work) for q in qualities]


def test_choose_asks_for_a_margin_of_standard_errors():
    """Four clips, cloud-only right on all. `steady` is 0.5 points down on every clip; `lucky` is
    right on three and 2 points down on one (both mean -0.5), and cheaper. `quality_gap` by hand
    (sample error): lucky sd 1, se 0.5; steady se 0. Within 1 point, the plain rule (z = 0) takes
    the cheaper `lucky`. The bound (calibration_objective.gap_bound) without pseudo-clips (unit 0),
    by hand over n + 2 = 6: both adjusted means -2/6; lucky var 4/6 - 1/9, se 0.304; steady var 1/6 -
    1/9, se 0.096. Two candidates, no order: z = 1.41 at margin 1 (lucky's bound -0.76: in),
    2.28 at margin 2 (-1.03: out, so `steady`). With the default pseudo-clips (one attribute, 16.7
    points) four clips show nothing within 1 point: the best quality, then the cheaper, flagged."""
    reference = _clips([1.0] * 4, 300)
    steady = _clips([0.995] * 4, 250)
    lucky = _clips([1.0, 1.0, 1.0, 0.98], 200)
    mean, se = quality_gap(lucky, reference)
    assert mean == pytest.approx(-0.5) and se == pytest.approx(0.5)
    assert quality_gap(steady, reference) == (pytest.approx(-0.5), pytest.approx(0.0, abs=1e-9))
    candidates = [("steady", steady), ("lucky", lucky)]
    assert choose(candidates, reference, 1.0, z=0.0)[::2] == ("lucky", True)
    assert choose(candidates, reference, 1.0, z=1.0, unit=0.0)[::2] == ("lucky", True)
    assert choose(candidates, reference, 1.0, z=2.0, unit=0.0)[::2] == ("steady", True)
    assert choose(candidates, reference, 1.0, z=1.0)[::2] == ("lucky", False)
    assert choose(candidates, reference, 0.1, z=0.0)[::2] == ("lucky", False)  # none within: best quality
    with pytest.raises(ValueError):
        quality_gap(steady[:3], reference)


# -- the presets table -------------------------------------------------------------------------------

def test_gate_table_round_trips_through_toml(tmp_path):
    gate = MeaningGate({7: 0.25, 3: 0.0, 151_000: 0.9}, 1.0, 'say "hi"\n请', "sys", "0123abcd")
    text = gate_toml(gate, description="fitted on 48 clips")
    path = tmp_path / "presets.toml"
    path.write_text('[lean]\nk = 8\n' + "\n".join(preset_gate_lines(0.8, math.inf)) + "\n\n" + text, encoding="utf-8")
    assert load_gate(path) == gate
    assert load_gate(path, tokenizer="0123abcd") == gate
    assert load_gate(path, tokenizer="ffff") is None  # another tokenizer: its ids mean other tokens
    import tomllib

    lean = tomllib.loads(path.read_text(encoding="utf-8"))["lean"]
    assert (lean["verify"], lean["gate_upload"], lean["gate_verify"]) == ("meaning", 0.8, math.inf)
    (tmp_path / "none.toml").write_text("[quality]\nk = 4\n", encoding="utf-8")
    assert load_gate(tmp_path / "none.toml") is None and load_gate(None) is None


@pytest.mark.parametrize("table, what", [
    ({"ids": [1, 2], "weights": [0.5], "instruction": "i", "system": "s"}, "same length"),
    ({"ids": [1, 1], "weights": [0.5, 0.5], "instruction": "i", "system": "s"}, "distinct"),
    ({"ids": [1], "weights": [1.5], "instruction": "i", "system": "s"}, "between 0 and 1"),
    ({"ids": [1], "weights": [0.5], "system": "s"}, "instruction"),
    ({"kind": "entropy", "instruction": "i", "system": "s"}, "kind"),
])
def test_a_malformed_gate_table_is_a_one_line_error(table, what):
    with pytest.raises(InputError) as err:
        parse_gate(table, "p.toml")
    assert what in str(err.value) and "p.toml" in str(err.value) and "\n" not in str(err.value)


def test_config_checks_the_gate_thresholds():
    with pytest.raises(ValueError, match="gate_upload"):
        DecodingConfig(gate_upload=-1.0)
    with pytest.raises(ValueError, match="gate_verify"):
        DecodingConfig(gate_verify=float("nan"))
    with pytest.raises(ValueError, match="verify"):
        DecodingConfig(verify="judge")  # type: ignore[arg-type]
