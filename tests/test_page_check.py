"""The page check: its arguments, its per-page table and verdict, and (where a Chromium is
installed) its measurements on a small page with one case of each rule."""

import subprocess
import sys

import pytest

from tools import page_check

FINDINGS = {
    "book/intro.html": {"column": 676, "scrolling": 0, "tables": [], "code": [], "figures": []},
    "notebooks/01_x.html": {
        "column": 676,
        "scrolling": 2,
        "tables": [{"cell": 3, "code": "frame", "width": 900}],
        "code": [{"cell": 1, "code": "import x", "height": 700}] * 2,
        "figures": [{"cell": 5, "code": "plt.plot()", "natural": 828, "shown": 676, "percent": 82}],
    },
}


def _book(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "00_a.html").write_text("<html></html>")
    return tmp_path


def _error(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        page_check.parse_args(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_a_missing_build_is_an_argument_error(tmp_path, capsys):
    assert "html_dir" in _error(capsys, [str(tmp_path / "nothing")])


def test_a_build_without_pages_is_an_argument_error(tmp_path, capsys):
    assert "no pages match" in _error(capsys, [str(tmp_path)])


def test_an_unknown_browser_is_an_argument_error(tmp_path, capsys):
    err = _error(capsys, [str(_book(tmp_path)), "--browser", "no-such-browser-binary"])
    assert "--browser" in err


def test_a_code_budget_must_be_positive(tmp_path, capsys):
    assert "--code-budget" in _error(capsys, [str(_book(tmp_path)), "--code-budget", "0"])


def test_screenshots_must_go_to_a_directory(tmp_path, capsys):
    book = _book(tmp_path)
    (tmp_path / "file.png").write_text("")
    err = _error(capsys, [str(book), "--screenshots", str(tmp_path / "file.png")])
    assert "--screenshots" in err


def test_the_cli_reports_bad_arguments_without_a_traceback(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "tools.page_check", str(tmp_path / "nothing")],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr and "html_dir" in run.stderr


def test_the_pages_are_the_chapters_and_the_book_pages(tmp_path):
    book = _book(tmp_path)
    (book / "book").mkdir()
    (book / "book" / "intro.html").write_text("")
    (book / "genindex.html").write_text("")
    names = [p.relative_to(book).as_posix() for p in page_check.book_pages(book)]
    assert names == ["book/intro.html", "notebooks/00_a.html"]


def test_the_table_counts_each_rule_per_page():
    table = page_check.report(FINDINGS).set_index("page")
    assert list(table.columns) == [
        "column px", "wide tables (scroll)", "tables cut off", "tall code", "scaled figures"
    ]  # fmt: skip
    assert table.loc["notebooks/01_x.html"].tolist() == [676, 2, 1, 2, 1]
    assert table.loc["book/intro.html"].tolist() == [676, 0, 0, 0, 0]


def test_cut_off_tables_always_fail_the_others_only_when_strict():
    table = page_check.report(FINDINGS)
    assert page_check.failures(table, False, False) == ["tables cut off: 1"]
    assert page_check.failures(table, True, True) == [
        "tables cut off: 1", "tall code: 2", "scaled figures: 1"
    ]  # fmt: skip
    clean = page_check.report({"book/intro.html": FINDINGS["book/intro.html"]})
    assert page_check.failures(clean, True, True) == []
    assert page_check.failures(page_check.report({}), True, True) == []


def test_each_finding_gets_a_line_naming_page_rule_cell_and_size():
    lines = page_check.details(FINDINGS)
    assert len(lines) == 4
    assert lines[0] == "notebooks/01_x.html: tables cut off: cell 3 (width 900): frame"
    assert "percent 82" in lines[-1]


PAGE = """<!doctype html><html><body style="margin:0"><main>
<article class="bd-article" style="width:600px; padding:0 20px">
<div class="cell"><div class="cell_output"><table style="width:900px"><tr><td>cut</td></tr>
</table></div></div>
<div class="cell"><div class="cell_output"><div style="overflow-x:auto">
<table style="width:900px"><tr><td>scrolls</td></tr></table></div></div></div>
<div class="cell"><div class="cell_input"><pre style="height:700px">tall = 1</pre></div></div>
<div class="cell"><details><summary>show</summary>
<div class="cell_input"><pre style="height:700px">hidden = 1</pre></div></details></div>
<div class="cell"><div class="cell_output"><img style="max-width:100%" src="data:image/svg+xml,
%3Csvg xmlns='http://www.w3.org/2000/svg' width='900' height='10'/%3E"></div></div>
<div class="cell"><div class="cell_output"><img src="data:image/svg+xml,
%3Csvg xmlns='http://www.w3.org/2000/svg' width='300' height='10'/%3E"></div></div>
</article></main></body></html>"""


@pytest.mark.skipif(page_check.find_browser() is None, reason="no Chromium installed")
def test_the_browser_finds_one_case_of_each_rule(tmp_path):
    book = _book(tmp_path)
    (book / "notebooks" / "00_a.html").write_text(PAGE)
    with page_check.launched_browser(page_check.find_browser()) as devtools:
        found = page_check.measure_page(devtools, book / "notebooks" / "00_a.html", 600)
        page_check.save_screenshot(devtools, tmp_path / "shot.png")
    assert found["column"] == 600 and found["scrolling"] == 1
    assert [t["width"] for t in found["tables"]] == [900]
    assert [(c["cell"], c["code"]) for c in found["code"]] == [(2, "tall = 1")]
    assert [f["natural"] for f in found["figures"]] == [900]  # drawn at the column's ~600 px
    assert 595 <= found["figures"][0]["shown"] <= 600
    assert (tmp_path / "shot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
