# sluice - tests/integration/test_layers.py: src/ is in folders by layer and
# includes only go down them (tests/tools/layers.py, which reads the order
# from src/README.md); no folder is missing from the list or its README.md.

import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "tests", "tools", "layers.py")


def layers(src):
    return subprocess.run([sys.executable, SCRIPT, src], capture_output=True, text=True,
                          timeout=30)


def test_src_includes_only_go_down():
    p = layers(os.path.join(ROOT, "src"))
    assert p.returncode == 0 and p.stdout == "layers ok\n", p.stdout + p.stderr


def make_tree(tmp_path, order, files):
    (tmp_path / "README.md").write_text(
        "# layers\n\n" + "".join(f"{i}. `{d}/` - job\n" for i, d in enumerate(order, 1)))
    for d in order:
        (tmp_path / d).mkdir(exist_ok=True)
        (tmp_path / d / "README.md").write_text(f"# {d}/\n")
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text(text)


def test_layer_script_reports_an_include_up(tmp_path):
    # low/a.c includes high/b.h (up: refused); high/b.c includes low/a.h
    # (down) and its own b.h; <stdio.h> and unknown headers are not ours.
    make_tree(tmp_path, ["low", "high"], {
        "low/a.h": "#include <stdio.h>\n",
        "low/a.c": '#include "a.h"\n#include "other.h"\n  #  include "b.h"\n',
        "high/b.h": '#include "a.h"\n',
        "high/b.c": '#include "b.h"\n#include "a.h"\n',
    })
    p = layers(str(tmp_path))
    assert p.returncode == 1, p.stdout
    assert p.stdout == "low/a.c:3: includes b.h (high/, above low/)\n", p.stdout


def test_layer_script_wants_every_folder_listed_and_described(tmp_path):
    make_tree(tmp_path, ["low"], {"low/a.c": "", "extra/x.c": ""})
    (tmp_path / "low" / "README.md").unlink()
    p = layers(str(tmp_path))
    assert p.returncode == 1, p.stdout
    assert "extra/: not listed in README.md\n" in p.stdout, p.stdout
    assert "low/: no README.md\n" in p.stdout, p.stdout
