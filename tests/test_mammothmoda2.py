"""The MammothModa2 family (Preview and Dev) on tiny random copies in the published layout, against a plain loop that
follows the authors' generate_t2i (modeling_mammothmoda2.py): their network run their way (whole sequences, the
uncond row masked down to its last 10 tokens, positions attention_mask.cumsum - 1, the FFN split by index between
mlp and gen_mlp, logits cat(lm_head, gen_head)) and their processors (transformers' warpers with
min_tokens_to_keep=3)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from mammothmoda2_fixture import EOL, VISUAL_START, expert_layers, qwen_config, write_tiny_mammothmoda2
from mammothmoda2_fixture import tiny_dev_dir, tiny_preview_dir  # noqa: F401  (fixtures, one per session)
from pace import assert_own_pace_gives_ar_tokens
from test_lossless import P_MIN, chi_square_pvalue

from scd_core import ModelLoadError, SamplerConfig, generate, load_model
from scd_core.decoding.sampler_options import resolved
from scd_core.decoding.sampling import to_probs
from scd_core.models.families import mammothmoda2
from scd_core.models.loading import detect_family, estimate_memory

PROMPT = "a red cube on the table"
ROWS, COLS = 2, 3  # 2 rows of 3 codes: 2 * (3 + 1) = 8 positions
VARIANTS = ("preview", "dev")


class SplitFFN(torch.nn.Module):
    """The authors' moe_forward: the rows of `route` through gen_mlp, the others through mlp, put back in order."""

    def __init__(self, mlp: torch.nn.Module, gen_mlp: torch.nn.Module, route: dict) -> None:
        super().__init__()
        self.mlp, self.gen_mlp, self.route = mlp, gen_mlp, route

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = self.route["mask"]
        out = torch.empty_like(x)
        out[mask], out[~mask] = self.gen_mlp(x[mask]), self.mlp(x[~mask])
        return out


class AuthorsNetwork:
    """The folder's weights in transformers' Qwen2 / Qwen3 model, read apart from load_model (sdpa: the uncond row's
    masked query positions stay finite, as in the authors' attention)."""

    def __init__(self, folder: Path) -> None:
        from safetensors.torch import load_file
        from transformers import Qwen2Model, Qwen3Model

        config = json.loads((folder / "config.json").read_text())
        qwen = qwen_config(config)
        qwen._attn_implementation = "sdpa"
        dev = qwen.model_type == "qwen3"
        self.net = (Qwen3Model if dev else Qwen2Model)(qwen).double().eval()
        state = {}
        for shard in sorted(folder.glob("*.safetensors")):
            state.update(load_file(str(shard)))
        prefix = "llm_model.model.language_model."
        text = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix) and ".gen_" not in k
                and not k.startswith(prefix + "gen_")}
        self.net.load_state_dict(text, strict=True)
        self.route: dict = {}
        for index in expert_layers(config):
            layer = self.net.layers[index]
            gen = type(layer.mlp)(qwen).double()
            gen.load_state_dict({k.split(".gen_mlp.")[1]: v for k, v in state.items()
                                 if k.startswith(f"{prefix}layers.{index}.gen_mlp.")})
            layer.mlp = SplitFFN(layer.mlp, gen, self.route)
        self.gen_embed = state[prefix + "gen_embed_tokens.weight"].double()
        self.heads = state["llm_model.lm_head.weight"].double(), state["llm_model.gen_head.weight"].double()
        text_config = config["llm_config"]["text_config"]
        self.gen_start = text_config.get("gen_vocab_start_index", text_config["vocab_size"])

    @torch.no_grad()
    def last_logits(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, L) ids and attention mask -> (B, V) float logits of the last position."""
        routed = ids >= self.gen_start
        embeds = self.net.embed_tokens(ids.masked_fill(routed, 0))
        embeds[routed] = self.gen_embed[ids[routed] - self.gen_start]
        self.route["mask"] = routed
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        hidden = self.net(inputs_embeds=embeds, attention_mask=mask, position_ids=positions).last_hidden_state[:, -1]
        return torch.cat([hidden @ self.heads[0].T, hidden @ self.heads[1].T], dim=-1).float()


def authors_scores(logits: torch.Tensor, cfg: float, t2i: dict, scope_end: int, top_k: int, top_p: float,
                   temperature: float) -> torch.Tensor:
    """generate_t2i's processors on the (cond, uncond) rows: CFG, temperature, scope, top-k, top-p (min 3 kept)."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scores = logits[1] + (logits[0] - logits[1]) * cfg if cfg > 1 else logits[0].clone()
    scores = scores[None]
    if temperature != 1.0:
        scores = TemperatureLogitsWarper(temperature)(None, scores)
    scores[:, :t2i["visual_token_start_id"]] = float("-inf")
    scores[:, scope_end:] = float("-inf")
    if top_k:
        scores = TopKLogitsWarper(top_k, min_tokens_to_keep=3)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p, min_tokens_to_keep=3)(None, scores)
    return scores[0]


def authors_rows(cond: list[int], cfg: float, fed: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """The processor's batch: the prompt twice with CFG, the uncond row's prompt masked but for its last 10 tokens;
    then the tokens `fed` since, attended in both rows (generate_t2i appends ones to the mask)."""
    ids = torch.tensor([[*cond, *fed]] * (2 if cfg > 1 else 1))
    mask = torch.ones_like(ids)
    if cfg > 1:
        mask[1:, :len(cond) - 10] = 0
    return ids, mask


def authors_greedy(net: AuthorsNetwork, cond: list[int], cfg: float, t2i: dict) -> list[int]:
    """generate_t2i with do_sample false: argmax of the processed scores, EOL written over each row's last step."""
    ids, mask = authors_rows(cond, cfg)
    start = len(cond)
    for _ in range(ROWS):
        for column in range(COLS + 1):
            scores = authors_scores(net.last_logits(ids, mask), cfg, t2i, t2i["visual_token_start_id"] +
                                    t2i["visual_token_end_id"], 0, 1.0, 1.0)
            token = t2i["eol_token_id"] if column == COLS else int(scores.argmax())
            ids = torch.cat([ids, torch.full((ids.shape[0], 1), token)], dim=1)
            mask = torch.cat([mask, torch.ones(ids.shape[0], 1, dtype=mask.dtype)], dim=1)
    return ids[0, start:].tolist()


def folder_of(variant: str, request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(f"tiny_{variant}_dir")


def loaded(folder: Path) -> mammothmoda2.MammothModa2Model:
    model = load_model(folder, device="cpu", dtype=torch.float64)
    model.set_grid(ROWS, COLS)
    return model


@pytest.fixture(scope="module", params=VARIANTS)
def sampled(request: pytest.FixtureRequest) -> tuple:
    folder = folder_of(request.param, request)
    return folder, loaded(folder), AuthorsNetwork(folder)


@pytest.fixture(scope="module", params=VARIANTS)
def greedy(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """A copy whose t2i_generation_config.json sets do_sample false (the authors then take the argmax)."""
    folder = tmp_path_factory.mktemp("greedy") / f"MammothModa2-{request.param}"
    write_tiny_mammothmoda2(folder, dev=request.param == "dev", seed=VARIANTS.index(request.param), do_sample=False)
    return folder, loaded(folder), AuthorsNetwork(folder)


def test_folders_are_recognised_with_their_variant_and_defaults(tiny_preview_dir: Path, tiny_dev_dir: Path) -> None:
    for folder, label, grid in ((tiny_preview_dir, "MammothModa2-Preview", (32, 32)),
                                (tiny_dev_dir, "MammothModa2-Dev", (16, 16))):
        assert detect_family(folder) is mammothmoda2
        model = load_model(folder, device="cpu", dtype=torch.float32)
        assert model.label == label and model.size == grid and model.num_tokens == grid[0] * (grid[1] + 1)
        assert (model.default_cfg_scale, model.default_temperature, model.default_top_k, model.default_top_p,
                model.min_tokens_kept) == (6.0, 0.9, 5, 0.95, 3)  # the folder's t2i_generation_config.json
        assert model.forced_tokens == {row * (grid[1] + 1) + grid[1]: EOL for row in range(grid[0])}
        assert model.scope == "authors" and int(model.code_ids[0]) == VISUAL_START
        assert not hasattr(model.module, "lm_head") and "visual" not in dict(model.module.named_modules())
        # the memory estimate leaves out what is never read: lm_head (another vocabulary x hidden), DiT, VAE, vision
        embeddings = model.module.model.embed_tokens.weight.numel()
        assert embeddings < estimate_memory(folder).other_weights < embeddings + 20_000


def test_prompt_is_the_chat_template_with_the_grid_and_a_10_token_uncond(sampled: tuple) -> None:
    """The uncond row is always the prompt's last 10 tokens (generate_t2i masks all but those), whatever they
    hold: at a 2 x 3 grid they reach back into the user turn."""
    _, model, _ = sampled
    prompt = model.encode(PROMPT)
    encode = model._tokenizer.encode
    text = ("<|im_start|>system\nYou are a helpful image generator.<|im_end|>\n<|im_start|>user\n"
            f"{PROMPT}<|im_end|>\n<|im_start|>assistant\n<|image start|>{ROWS}*{COLS}<|image token|>")
    assert list(prompt.cond) == encode(text)
    assert prompt.uncond == prompt.cond[-10:] and prompt.cond[-2:] == (*encode(str(COLS)), model._image_token)
    model.set_grid(32, 32)  # two digits a side: the 10 tokens are then exactly the assistant turn's start
    try:
        assert list(model.encode(PROMPT).uncond) == encode("<|im_start|>assistant\n<|image start|>32*32<|image token|>")
    finally:
        model.set_grid(ROWS, COLS)
    assert model._image_start == 152069 and model._image_token == 152070 and model.t2i.eol == EOL


@pytest.mark.parametrize("cfg", [1.0, 6.0])
def test_greedy_equals_the_authors_loop(greedy: tuple, cfg: float) -> None:
    folder, model, net = greedy
    t2i = json.loads((folder / "t2i_generation_config.json").read_text())
    prompt = model.encode(PROMPT)
    expected = torch.tensor([authors_greedy(net, list(prompt.cond), cfg, t2i)])
    assert model.default_top_k == 1 and model.min_tokens_kept == 1
    for window in (1, 8, "auto"):
        for coupler in ("faithful", "maximal"):
            ours = generate(model, prompt, SamplerConfig(coupler=coupler, window=window, cfg_scale=cfg, seed=5))
            assert torch.equal(ours.tokens, expected), (coupler, window, cfg)


@pytest.mark.parametrize("scope", mammothmoda2.SCOPES)
@pytest.mark.parametrize("settings", [dict(), dict(top_k=2, top_p=0.3, temperature=1.3)])
def test_sampled_law_is_the_authors_processor_chain(sampled: tuple, scope: str, settings: dict) -> None:
    """At every code position of a sequence, to_probs of the session's logits equals the authors' processors
    softmaxed (the folder's temperature 0.9, top-k 5, top-p 0.95; then top-k 2 and top-p 0.3, where their 3 kept
    tokens decide), over the scope's ids."""
    folder, model, net = sampled
    t2i = json.loads((folder / "t2i_generation_config.json").read_text())
    model.set_scope(scope)
    try:
        prompt = model.encode(PROMPT)
        config = SamplerConfig(window=4, seed=1, cfg_scale=6.0, **settings)
        tokens = generate(model, prompt, config).tokens
        session = model.start(prompt, batch_size=1)
        cond, uncond = (torch.cat(pair, dim=1) for pair in zip(session.prefill(), session.forward(tokens[:, :-1])))
        ours = to_probs(cond, uncond, resolved(model, config))[0]
        sampling = resolved(model, config)
        end = (VISUAL_START + model.t2i.end if scope == "authors" else model.t2i.end)
        for position in (p for p in range(model.num_tokens) if p not in model.forced_tokens):
            ids, mask = authors_rows(list(prompt.cond), 6.0, tokens[0, :position].tolist())
            scores = authors_scores(net.last_logits(ids, mask), 6.0, t2i, end, sampling.top_k, sampling.top_p,
                                    sampling.temperature)
            expected = torch.softmax(scores, -1)
            assert expected[model.code_ids].sum() > 1 - 1e-6 and (expected[model.code_ids] > 0).sum() >= 3
            torch.testing.assert_close(ours[position], expected[model.code_ids], atol=1e-6, rtol=0)
    finally:
        model.set_scope("authors")


def test_scopes_sample_the_authors_ids_or_the_codes(sampled: tuple) -> None:
    """The authors' scope runs to the end of the logits (their start + absolute end lies past it); "codes" stops at
    visual_token_end_id."""
    _, model, _ = sampled
    gen_columns = model.module.text_vocab + model.module.gen_embed_tokens.num_embeddings  # the logits' end
    assert model.code_ids.tolist() == list(range(VISUAL_START, gen_columns))
    model.set_scope("codes")
    try:
        assert model.code_ids.tolist() == list(range(VISUAL_START, model.t2i.end)) and model.vocab_size == 24
    finally:
        model.set_scope("authors")
    with pytest.raises(ValueError, match="scope must be one of authors, codes"):
        model.set_scope("all")


@pytest.mark.parametrize("sampled, coupler", [("preview", "maximal"), ("dev", "faithful")], indirect=["sampled"])
def test_output_law_is_the_authors(sampled: tuple, coupler: str) -> None:
    """Chi-square of whole 1 x 2 grids (two codes, then the forced EOL) against the law the authors' chain gives,
    enumerated: raw-logit CFG 6, temperature 0.9, top-k 3 (min 3 kept), on the uncond row masked to 10 tokens."""
    folder, model, net = sampled
    t2i = json.loads((folder / "t2i_generation_config.json").read_text())
    model.set_grid(1, 2)
    try:
        prompt = model.encode(PROMPT)
        end = VISUAL_START + model.t2i.end
        law = {}

        def probs(fed: list[int]) -> torch.Tensor:
            ids, mask = authors_rows(list(prompt.cond), 6.0, fed)
            return torch.softmax(authors_scores(net.last_logits(ids, mask), 6.0, t2i, end, 3, 1.0, 0.9), -1)

        p0 = probs([])
        for a in torch.nonzero(p0).flatten().tolist():
            p1 = probs([a])
            for b in torch.nonzero(p1).flatten().tolist():
                law[(a, b, EOL)] = float(p0[a] * p1[b])
        result = generate(model, prompt, SamplerConfig(coupler=coupler, window=3, cfg_scale=6.0, top_k=3, top_p=1.0,
                                                       seed=11), batch_size=4000)
        assert len(law) == 9 and chi_square_pvalue(result.tokens, law) > P_MIN
    finally:
        model.set_grid(ROWS, COLS)


def test_faithful_window_8_gives_the_window_1_tokens(sampled: tuple) -> None:
    _, model, _ = sampled
    prompt = model.encode(PROMPT)
    for seed in (0, 1):
        ar = generate(model, prompt, SamplerConfig(coupler="faithful", window=1, seed=seed), batch_size=2)
        jacobi = generate(model, prompt, SamplerConfig(coupler="faithful", window=8, seed=seed), batch_size=2)
        assert torch.equal(ar.tokens, jacobi.tokens) and jacobi.nfe < ar.nfe


def test_rows_at_their_own_pace_give_the_window_1_tokens(sampled: tuple) -> None:
    _, model, _ = sampled
    model.set_grid(4, 4)  # 20 positions: rows then finish at different calls
    try:
        assert_own_pace_gives_ar_tokens(model, model.encode(PROMPT), seed=2)
    finally:
        model.set_grid(ROWS, COLS)


def test_int8_loads_and_samples(tiny_preview_dir: Path) -> None:
    from scd_core.models.weights.quantize import Int8Linear

    model = load_model(tiny_preview_dir, device="cpu", dtype=torch.float32, quantize="int8")
    model.set_grid(ROWS, COLS)
    assert isinstance(model.module.model.layers[2].gen_mlp.up_proj, Int8Linear)
    tokens = generate(model, model.encode(PROMPT), SamplerConfig(window=4, seed=0)).tokens
    assert tokens.shape == (1, model.num_tokens) and all(int(tokens[0, p]) == EOL for p in model.forced_tokens)


def test_decode_without_a_prompt_or_of_bad_tokens_is_one_line(sampled: tuple) -> None:
    folder, _, _ = sampled
    model = loaded(folder)  # no session started: no prompt to re-encode the tokens with
    prompt = model.encode(PROMPT)
    for tokens, cond, message in ((torch.full((1, model.num_tokens), VISUAL_START), None, "needs the prompt"),
                                  (torch.full((1, 3), VISUAL_START), prompt, r"tokens must be \(batch, 8\)"),
                                  (torch.full((1, model.num_tokens), -1), prompt, "token ids must lie in")):
        with pytest.raises(ValueError, match=message) as err:
            model.decode(tokens, cond)
        assert "\n" not in str(err.value)


def test_bad_grids_get_one_line_and_change_nothing(sampled: tuple) -> None:
    _, model, _ = sampled
    for call in (lambda: model.set_grid(0, 4), lambda: model.set_grid(2, -1), lambda: model.set_image_size(16, 1024),
                 lambda: model.set_grid(2.5, 3)):
        with pytest.raises(ValueError, match="the grid must be at least 1 x 1 codes") as err:
            call()
        assert "\n" not in str(err.value) and model.size == (ROWS, COLS) and model.num_tokens == 8
    model.set_image_size(64, 96)  # one code per 32 px
    assert model.size == (3, 2)
    model.set_grid(ROWS, COLS)


def rewritten(folder: Path, tmp_path: Path, name: str, change) -> Path:
    copy = Path(shutil.copytree(folder, tmp_path / folder.name))
    path = copy / name
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return copy


def test_bad_folders_get_one_line(tiny_preview_dir: Path, tiny_dev_dir: Path, tmp_path: Path) -> None:
    """A Preview folder labelled for Dev's code (the authors' issue #2) and the reverse, an unknown language model,
    a missing t2i_generation_config.json and a repetition penalty are each refused in one line."""
    cases = [
        (rewritten(tiny_preview_dir, tmp_path / "a", "config.json",
                   lambda c: c["llm_config"].update(model_type="mammothmoda2_qwen3_vl")),
         "names MammothModa2-Dev but the weights are Preview's .*issue #2"),
        (rewritten(tiny_dev_dir, tmp_path / "b", "config.json",
                   lambda c: c["llm_config"].update(model_type="mammothmoda2_qwen2_5_vl")),
         "names MammothModa2-Preview but the weights are Dev's .*issue #2"),
        (rewritten(tiny_preview_dir, tmp_path / "c", "config.json",
                   lambda c: c["llm_config"].update(model_type="qwen2_5_vl")), "is neither of"),
        (rewritten(tiny_preview_dir, tmp_path / "d", "t2i_generation_config.json",
                   lambda c: c.update(repetition_penalty=1.1)), "repetition_penalty 1.1"),
    ]
    missing = Path(shutil.copytree(tiny_preview_dir, tmp_path / "e" / tiny_preview_dir.name))
    (missing / "t2i_generation_config.json").unlink()
    cases.append((missing, "has no t2i_generation_config.json"))
    for folder, message in cases:
        with pytest.raises(ModelLoadError, match=message) as err:
            load_model(folder, device="cpu")
        assert "\n" not in str(err.value)
