"""Flags lead refuses by name, each with why and what to do instead: its own that are
gone, and llama-server's for what lead does not have (a script written for llama-server
stops at once, saying so, rather than running without what it asked for)."""

from __future__ import annotations

# llama-server's draft model runs in its process; lead's drafts come from backs
DRAFT = ("lead drafts with a back, on this machine or another: python -m back --lead "
         "HOST:PORT -m FILE (its own --threads, --n-gpu-layers, --ctx-size)")
DRAFT_FLAGS = ("-md", "--model-draft", "--spec-draft-model", "-ngld", "--gpu-layers-draft",
               "--n-gpu-layers-draft", "--spec-draft-ngl", "-devd", "--device-draft",
               "--spec-draft-device", "-td", "--threads-draft", "--spec-draft-threads",
               "-cd", "--ctx-size-draft", "--spec-draft-ctx-size", "--spec-type")
MEDIA = "lead serves text models: no image or audio input (no projector)"
FLAGS = {
    "--tree": "lead-side trees were removed: lead verifies chains (a back's branches are "
              "still used, as its next draft after a rejection; docs/cost-model.md)",
    "--max-poll-s": "gone, with the long-polls (GET /duo/state): backs hear every session's "
                    "news on the link (GET /duo/link), which waits for none",
    **{flag: DRAFT for flag in DRAFT_FLAGS},
    **{flag: MEDIA for flag in ("-mm", "--mmproj", "-mmu", "--mmproj-url", "--media-path",
                                "--image-min-tokens", "--image-max-tokens")},
    **{flag: "lead applies no LoRA adapter or control vector: merge it into the GGUF"
       for flag in ("--lora", "--lora-scaled", "--control-vector", "--control-vector-scaled")},
    **{flag: "lead has no reranking endpoint" for flag in ("--rerank", "--reranking")},
    "--tools": "lead runs no built-in tools: the client runs the tools it offers",
    **{flag: "lead has no MCP proxy" for flag in ("--ui-mcp-proxy", "--webui-mcp-proxy")},
    "--models-dir": "lead serves one model (-m); run a lead per model",
    "--override-kv": "lead takes a GGUF's metadata as it is",
    **{flag: "lead does not extend the context by group attention (self-extend)"
       for flag in ("-gan", "--grp-attn-n", "-gaw", "--grp-attn-w")},
}


def refused(argv: list[str]) -> str | None:
    """The first refused flag of `argv`, with why ("--flag: why"); None where none is."""
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag in FLAGS:
            return f"{flag}: {FLAGS[flag]}"
    return None
