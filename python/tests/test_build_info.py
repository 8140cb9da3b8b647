"""attn.build_info() and `attn info`: one instruction-set choice, reported the same way by both, and
ATTN_CPU_ISA honoured by every kernel family (checked in a child process, which reads it at start)."""

import json
import os
import subprocess
import sys

import attn

KEYS = {
    "version",
    "cpu",
    "available",
    "isa",
    "isa_source",
    "attention_f32",
    "attention_bf16",
    "elementwise",
    "gemm",
    "bf16_gemm_native",
}


def _child_info(isa):
    env = {**os.environ, "ATTN_CPU_ISA": isa}
    code = "import json, attn; print(json.dumps(attn.build_info()))"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )


def test_build_info_names_the_version_and_each_family():
    info = attn.build_info()
    assert set(info) == KEYS
    assert info["version"] == attn.__version__
    assert info["isa"] in info["available"]
    assert info["available"][0] == "portable"
    if os.environ.get("ATTN_CPU_ISA"):
        assert info["isa_source"] == "ATTN_CPU_ISA"
    else:
        assert info["isa_source"] == "best available"
    assert info["gemm"].startswith("f32: oneDNN")


def test_the_cli_reports_the_same_choice():
    out = subprocess.run(
        [os.environ["ATTN_BIN"], "info", "--json"], capture_output=True, text=True, check=True
    )
    cli = json.loads(out.stdout)
    info = attn.build_info()
    for key in ("version", "cpu", "available", "isa", "attention_f32", "attention_bf16"):
        assert cli[key] == info[key], key


def test_a_chosen_target_is_taken_by_every_family():
    wants = {"portable": "portable", "avx2": "avx2", "avx512": "avx512", "avx512bf16": "avx512"}
    for isa, vectors in wants.items():
        if isa not in attn.build_info()["available"]:
            continue
        child = _child_info(isa)
        assert child.returncode == 0, child.stderr
        info = json.loads(child.stdout)
        assert (info["isa"], info["isa_source"]) == (isa, "ATTN_CPU_ISA")
        assert info["attention_f32"] == info["attention_bf16"] == isa
        assert info["elementwise"] == vectors
        if isa in ("portable", "avx2", "avx512"):
            assert not info["bf16_gemm_native"]


def test_an_impossible_target_is_a_clear_error():
    for isa in ("bogus", "amx", "avx512bf16"):
        if isa in attn.build_info()["available"]:
            continue
        child = _child_info(isa)
        assert child.returncode != 0
        assert f"ATTN_CPU_ISA={isa}" in child.stderr, child.stderr
