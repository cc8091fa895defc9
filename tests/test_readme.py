"""The README is the front door: short, its set-up and test commands the ones CI runs, its links alive.

`.ci/run` must run exactly the README's set-up and test commands; the README links only to pages of the
docs site that exist and that mkdocs.yml's nav lists (a page left out of the nav would not be found)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def bash_block_after(heading: str) -> list[str]:
    section = README[README.index(heading):]
    return [line for line in re.search(r"```bash\n(.*?)```", section, re.S).group(1).splitlines() if line.strip()]


def test_readme_is_at_most_200_lines():
    assert len(README.splitlines()) <= 200


def test_the_bet_tables_figures_are_the_studies_own():
    """Every figure of the README's bet table (a number with 3+ decimals, a share in %) stands on the study page
    its row comes from: docs/setups.md for the compare rows, the page a row links to for the others."""
    section = README[README.index("## The bet, measured"):]
    table = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(table) >= 2
    setups = (ROOT / "docs" / "setups.md").read_text()
    for row in table:
        linked = re.findall(r"\]\((docs/[^)#]+)", row)
        page = (ROOT / linked[0]).read_text() if linked else setups
        for figure in re.findall(r"\d\.\d{4}|\d+% \[[^\]]+\]|\b\d+%", row):
            assert figure in page or figure in setups, f"{figure!r} of the bet row {row[:60]!r} is not in the study"


def test_ci_runs_the_readmes_set_up_and_test_commands():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    (set_up,) = bash_block_after("## Set-up")
    (tests,) = bash_block_after("## Tests")
    assert set_up in ci and tests in ci
    assert ci.index(set_up) < ci.index(tests)
    assert any(line.startswith("NO_MKDOCS_2_WARNING=1 mkdocs build --strict") for line in ci)


def test_readme_links_to_docs_pages_in_the_site_nav():
    nav = set(re.findall(r":\s*(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", README)
    assert links, "the README links to the docs"
    for link in links:
        assert (ROOT / link).is_file(), link
        assert link.removeprefix("docs/") in nav, f"{link} is not in mkdocs.yml's nav"


def fenced(text: str, lang: str = "bash") -> list[list[str]]:
    return [[line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
            for block in re.findall(rf"```{lang}\n(.*?)```", text, re.S)]


def test_docs_home_and_own_data_guide_repeat_the_readmes_commands():
    """Commands the docs repeat from the README are the README's (which CI and the quickstart test run)."""
    (set_up,), (tests,) = bash_block_after("## Set-up"), bash_block_after("## Tests")
    (main_job,) = bash_block_after("## Main job")
    home = fenced((ROOT / "docs" / "index.md").read_text())
    assert [set_up, main_job, tests] in home
    quickstart = README[README.index("<!-- quickstart:begin"):]
    assert fenced(quickstart)[0] in fenced((ROOT / "docs" / "guide" / "own-data.md").read_text())
