"""The package's own imports: no module of attn imports another that imports it back (at any depth, lazy imports
inside functions included), and the NumPy path never loads torch."""

import ast
import pathlib
import subprocess
import sys

import attn

PACKAGE = pathlib.Path(attn.__file__).parent


def _imports(path: pathlib.Path) -> set:
    """The attn modules `path` imports (relative imports and absolute attn.* ones), anywhere in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:
                found.update(alias.name for alias in node.names)
            elif node.module and node.module.startswith("attn."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("attn."))
    return found


def test_no_import_circles():
    modules = {p.stem: p for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    graph = {name: _imports(path) & modules.keys() for name, path in modules.items()}
    assert graph["_sdpa"] <= {"_torch_ops"}, graph["_sdpa"]

    def visit(name, trail):
        assert name not in trail, "import circle: " + " -> ".join([*trail, name])
        for nxt in sorted(graph[name]):
            visit(nxt, [*trail, name])

    for name in sorted(graph):
        visit(name, [])


def test_the_numpy_path_loads_no_torch():
    code = (
        "import sys, numpy as np, attn, attn.nn, attn.models, attn.viz\n"
        "q = np.ones((1, 1, 3, 4), np.float32)\n"
        "attn.attention(q, q, q, causal=True)\n"
        "attn.scaled_dot_product_attention(q, q, q, is_causal=True)\n"
        "with attn.nn.no_grad():\n"
        "    attn.nn.Linear(4, 2)(np.ones((3, 4), np.float32))\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
