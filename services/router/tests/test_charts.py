"""The console's SVG charts, pure: labels escaped wherever they appear, an empty chart says so,
one point is drawn, and the y axis goes up to a round number with labelled ticks."""

import re
from xml.etree import ElementTree

import pytest

from llmgw.router.console.charts import Chart, Series, line_chart, nice_ceiling, x_ticks, y_ticks

SVG = "{http://www.w3.org/2000/svg}"


def _chart(series, title="Tokens <per> hour"):
    return line_chart(Chart("c1", title, lambda x: f"t{x:g}", lambda y: f"{y:g} tok", "Nothing yet"), series)


def test_a_label_with_markup_is_shown_as_text_everywhere():
    svg = str(_chart([Series('<script>alert("x")</script>', [(0, 1), (60, 3)])]))
    assert "<script>" not in svg and 'alert("x")' not in svg
    tree = ElementTree.fromstring(svg)  # well-formed: escaping did not break the markup
    assert tree.find(f"{SVG}title").text == "Tokens <per> hour"
    legend = [t.text for t in tree.iter(f"{SVG}text")]
    assert '<script>alert("x")</script>' in legend
    points = tree.findall(f"{SVG}circle")
    assert [p.get("data-series") for p in points] == ['<script>alert("x")</script>'] * 2
    assert points[1].find(f"{SVG}title").text == '<script>alert("x")</script>: t60: 3 tok'


def test_an_empty_chart_says_so_and_has_its_title():
    for series in ([], [Series("a", [])]):
        tree = ElementTree.fromstring(str(_chart(series)))
        assert tree.get("role") == "img" and tree.get("aria-labelledby") == "c1-title"
        assert [t.text for t in tree.iter(f"{SVG}text")] == ["Nothing yet"]
        assert not tree.findall(f"{SVG}circle")


def test_one_point_is_drawn_in_the_middle_with_its_ticks():
    tree = ElementTree.fromstring(str(_chart([Series("m", [(120, 7)])])))
    [point] = tree.findall(f"{SVG}circle")
    assert (point.get("data-x"), point.get("data-y")) == ("120", "7")
    assert float(point.get("cx")) == (64 + 720 - 16) / 2
    words = [t.text for t in tree.iter(f"{SVG}text")]
    assert words[:5] == ["0 tok", "2 tok", "4 tok", "6 tok", "8 tok"] and "t120" in words
    assert not tree.findall(f"{SVG}polyline")  # one point: no line


def test_points_are_placed_by_value_and_lines_join_them():
    tree = ElementTree.fromstring(str(_chart([Series("a", [(0, 0), (10, 50)]), Series("b", [(0, 100)])])))
    a0, a1, b0 = tree.findall(f"{SVG}circle")
    assert float(a0.get("cy")) > float(a1.get("cy")) > float(b0.get("cy"))  # 0 low, 100 at the top
    assert a0.get("fill") != b0.get("fill") and len(tree.findall(f"{SVG}polyline")) == 1


def test_round_ceilings_and_ticks_on_round_numbers_and_on_the_points():
    assert [nice_ceiling(v) for v in (0, 0.3, 1, 7, 12, 200, 201, 4999)] == [1, 0.5, 1, 10, 20, 200, 500, 5000]
    assert y_ticks(1, whole=True) == [0, 1] and y_ticks(3, whole=True) == [0, 1, 2, 3]
    assert y_ticks(50, whole=True) == [0, 10, 20, 30, 40, 50] and y_ticks(7, whole=True) == [0, 2, 4, 6, 8]
    assert y_ticks(0.3, whole=False) == pytest.approx([0, 0.1, 0.2, 0.3])
    assert y_ticks(0, whole=True) == [0, 1]
    assert x_ticks([5, 1, 3, 3]) == [1, 3, 5] and x_ticks(list(range(13))) == [0, 2, 4, 6, 8, 10, 12]
    assert not re.search(r"nan|inf", str(_chart([Series("z", [(0, 0), (5, 0)])])))
