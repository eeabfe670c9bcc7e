"""The console's modal dialogs: a menu, a yes/no question that says what will happen, and a form
of fields that are checked before anything is asked of the fleet."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Checkbox, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from llmgw.ctl.tui.words import Words

__all__ = ["Confirm", "Field", "Form", "Menu", "whole"]


class Menu(ModalScreen[str | None]):
    """Choose one of `items` (id, label); None: esc."""

    BINDINGS = [Binding("escape", "dismiss(None)", "back")]

    def __init__(self, title: str, items: list[tuple[str, str]]) -> None:
        super().__init__()
        self.title_text, self.items = title, items

    def compose(self) -> ComposeResult:
        """Its title and its items."""
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title")
            yield OptionList(*(Option(label, id=key) for key, label in self.items), id="menu")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        """The item chosen (enter)."""
        self.dismiss(event.option.id)


class Confirm(ModalScreen[bool]):
    """A disruptive change asked about first, saying what will happen: y or n."""

    BINDINGS = [Binding("y", "dismiss(True)", "yes"), Binding("n,escape", "dismiss(False)", "no")]

    def __init__(self, question: str, words: Words) -> None:
        super().__init__()
        self.question, self.w = question, words

    def compose(self) -> ComposeResult:
        """The question and its keys."""
        with Vertical(classes="dialog"):
            yield Static(self.question, id="question")
            yield Label(f"{self.w.t('confirm.yes')}   {self.w.t('confirm.no')}")


@dataclass
class Field:
    """One field of a form: its id, its label, its value now; a checkbox where `check`."""

    id: str
    label: str
    value: str = ""
    check: bool = False


class Form(ModalScreen[dict[str, str] | None]):
    """Fields filled and saved with enter (their values by id, a checkbox's as "1" or ""); None: esc.
    `note` is a line under the fields the caller may change as fields change (`on_change`)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "cancel")]

    def __init__(self, title: str, fields: list[Field], words: Words, note: str = "") -> None:
        super().__init__()
        self.title_text, self.fields, self.w, self.note = title, fields, words, note

    def compose(self) -> ComposeResult:
        """Its fields, its note, why it was refused, and its keys."""
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title")
            for f in self.fields:
                if f.check:
                    yield Checkbox(f.label, value=f.value == "1", id=f"f-{f.id}")
                else:
                    yield Label(f.label)
                    yield Input(value=f.value, id=f"f-{f.id}")
            yield Static(self.note, id="note")
            yield Static("", id="refused", classes="refused")
            yield Label(f"{self.w.t('form.save')}   {self.w.t('form.cancel')}")

    def values(self) -> dict[str, str]:
        """Each field's value now."""
        out = {}
        for f in self.fields:
            widget = self.query_one(f"#f-{f.id}")
            out[f.id] = ("1" if widget.value else "") if isinstance(widget, Checkbox) else widget.value.strip()
        return out

    def say(self, note: str = "", refused: str = "") -> None:
        """Show `note` under the fields, and why the form was refused (in the warning colour)."""
        self.query_one("#note", Static).update(note)
        self.query_one("#refused", Static).update(refused)

    def on_input_submitted(self, _: Input.Submitted) -> None:
        """Saved (enter in any field)."""
        self.dismiss(self.values())


def whole(raw: str, low: int, high: int, field: str, w: Words) -> int:
    """`raw` as a whole number from `low` to `high`; ValueError saying which field and what it takes."""
    if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
        raise ValueError(w.t("form.number", field=field, got=raw, low=low, high=high))
    return int(raw)
