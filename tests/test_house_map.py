"""docs/design.md's house map is the code's: tools/house_map.py, run on today's imports, gives the block the page
holds (grimp's import graph, the one lint-imports checks); a new room or an import that changes the layering
changes the picture, and this test says to redraw it."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_house_map_in_design_md_is_drawn_from_todays_code():
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "house_map.py"), "--check"], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr


def test_the_house_map_shows_every_room_and_the_experiments_rooms():
    page = (ROOT / "docs" / "design.md").read_text()
    block = page.split("<!-- house-map:begin")[1].split("<!-- house-map:end -->")[0]
    # the rooms: data/, each folder of featurize/ and heads/, each folder of heads/experiments/ (a folder inside a
    # room, heads/apply/tunings, belongs to its room)
    rooms = [ROOT / "data", *(p for top in ("featurize", "heads") for p in (ROOT / top).iterdir()
                              if (p / "__init__.py").exists()),
             *(p for p in (ROOT / "heads" / "experiments").iterdir() if (p / "__init__.py").exists())]
    assert len(rooms) > 15
    for room in rooms:
        dotted = ".".join(room.relative_to(ROOT).parts)
        assert f'["{dotted}' in block, f"{dotted} is not in the house map"
