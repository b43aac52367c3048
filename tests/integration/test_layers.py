# sluice - tests/integration/test_layers.py: src/ is in folders by layer and
# includes only go down them (tests/tools/layers.py, which reads the order
# from src/README.md); no folder is missing from the list or its README.md.

import importlib.util
import os

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_spec = importlib.util.spec_from_file_location(
    "layers", os.path.join(ROOT, "tests", "tools", "layers.py"))
layers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layers)


def test_src_includes_only_go_down(capsys):
    assert layers.main(["layers.py", os.path.join(ROOT, "src")]) == 0
    assert capsys.readouterr().out == "layers ok\n"


def make_tree(tmp_path, order, files):
    (tmp_path / "README.md").write_text(
        "# layers\n\n" + "".join(f"{i}. `{d}/` - job\n" for i, d in enumerate(order, 1)))
    for d in order:
        (tmp_path / d).mkdir(exist_ok=True)
        (tmp_path / d / "README.md").write_text(f"# {d}/\n")
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text(text)


def test_layer_script_reports_an_include_up(tmp_path, capsys):
    # low/a.c includes high/b.h (up: refused); high/b.c includes low/a.h
    # (down) and its own b.h; <stdio.h> and unknown headers are not ours.
    make_tree(tmp_path, ["low", "high"], {
        "low/a.h": "#include <stdio.h>\n",
        "low/a.c": '#include "a.h"\n#include "other.h"\n  #  include "b.h"\n',
        "high/b.h": '#include "a.h"\n',
        "high/b.c": '#include "b.h"\n#include "a.h"\n',
    })
    assert layers.main(["layers.py", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out == "low/a.c:3: includes b.h (high/, above low/)\n", out


def test_layer_script_wants_every_folder_listed_and_described(tmp_path, capsys):
    make_tree(tmp_path, ["low"], {"low/a.c": "", "extra/x.c": ""})
    (tmp_path / "low" / "README.md").unlink()
    assert layers.main(["layers.py", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "extra/: not listed in README.md\n" in out, out
    assert "low/: no README.md\n" in out, out
