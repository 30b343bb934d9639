"""Form fields built from one `FieldSpec` each: an integer, a switch, and the error-code list.

A field holds one value of the card's draft. It validates as the operator types (the reason shows
under it), clamps an out-of-range integer when the operator leaves it, and says so. It knows
nothing of the runtime: the card reads `value`, calls `load()` and `show_message()`, and hears
`SettingField.Edited` whenever the operator changes something.
"""

from __future__ import annotations

from typing import ClassVar

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.validation import ValidationResult, Validator
from textual.widget import Widget
from textual.widgets import Button, Checkbox, Input, Label, OptionList, Static

from omniroute_tui.cards.catalog import format_default, format_range
from proxy.settings import INT_LIST_MAX_ITEMS, FieldSpec

__all__ = [
    "BoolField",
    "CodeListField",
    "IntField",
    "SettingField",
    "clamp",
    "field_id",
    "parse_int",
]


def field_id(path: str) -> str:
    """The widget id of a field: `providerBreaker.apikey.failureThreshold` -> `f-providerBreaker-apikey-...`."""
    return "f-" + path.replace(".", "-")


def parse_int(text: str) -> int | None:
    """Plain decimal digits with an optional minus sign, as `proxy.settings` reads them; else None."""
    raw = text.strip()
    digits = raw[1:] if raw.startswith("-") else raw
    if not digits.isdecimal() or not digits.isascii():
        return None
    return int(raw)


def clamp(spec: FieldSpec, value: int) -> tuple[int, str | None]:
    """(value, None) when in range, else (the nearest bound, "clamped to <bound>: <the schema's reason>")."""
    _, message = spec.check(value)
    if message is None:
        return value, None
    low = spec.min if spec.min is not None else value
    high = spec.max if spec.max is not None else value
    bounded = min(max(value, low), high)
    return bounded, f"clamped to {bounded}: {message}"


WALK: list[BindingType] = [
    Binding("down,j", "app.focus_next", "Next field", show=False, id="settings-next-field"),
    Binding("up,k", "app.focus_previous", "Previous field", show=False, id="settings-previous-field"),
]
"""How the Settings tab is walked by keyboard: every stop on it has these, fields and buttons."""


class WalkButton(Button):
    """A card's button: a stop on the walk like a field (without j/k, `j` stopped on Save)."""

    BINDINGS: ClassVar[list[BindingType]] = WALK


class FieldInput(Input):
    """An Input that is edited on purpose, never by a stray key.

    In navigation mode (the default) it cannot take focus, so the console's keys (`1`–`6`, `q`,
    `p`, `/`) keep working while the operator moves through a card; its field is the focus stop.
    `enter` or `i` on the field (or a click) starts editing: the input takes focus. `escape` (or
    leaving it any other way) ends editing and gives focus back to the field, so a second `escape`
    reaches the card, which discards the draft.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "leave", "Leave the field", show=False, id="settings-leave-field"),
    ]

    def on_mount(self) -> None:
        self.can_focus = False

    def focus(self, scroll_visible: bool = True) -> FieldInput:
        """Start editing (a programmatic focus is an explicit edit, like `enter`)."""
        self.can_focus = True
        super().focus(scroll_visible)
        return self

    def action_leave(self) -> None:
        home = self.parent
        while home is not None and not (isinstance(home, Widget) and home.can_focus):
            home = home.parent
        if isinstance(home, Widget) and home is not self:
            home.focus()
        else:
            self.blur()

    def _on_blur(self, event: events.Blur) -> None:
        self.can_focus = False  # editing ends with the focus, whichever way it left


def _tooltip(spec: FieldSpec) -> str:
    return f"{spec.path}\n{spec.help}\nAccepts {spec.accepted()}; default {format_default(spec)}."


class SettingField(Widget):
    """One schema field. `label=None` lays it out as a grid cell (the row names the field).

    A row is `name | control | hint` with the message line under it; the message widget is only
    mounted once there is something to say (a card has ~50 fields, and widget count is what
    makes a Textual screen slow to style and lay out).
    """

    DEFAULT_CSS = """
    SettingField {
        height: auto;
        width: 1fr;
        layout: grid;
        grid-size: 3;
        grid-columns: 26 12 1fr;
        grid-rows: auto;
        & > .hint { color: $text-muted; padding: 0 1; }
        & > .message { column-span: 3; padding: 0 0 0 26; color: $text-warning; }
        & > .message.-error { color: $text-error; }
        & > .message.-hidden { display: none; }
        &.-cell { layout: vertical; }
        &.-cell > .hint, &.-cell > .message { padding: 0; }
        & > Input, & > Checkbox { width: 1fr; }
        /* Navigation focus sits on the field, not its input: show where it is. */
        &:focus > FieldInput { background: $accent 40%; }
        &:focus > .name { text-style: bold reverse; }
    }
    """

    class Edited(Message):
        """The operator changed this field's draft value."""

        def __init__(self, field: SettingField) -> None:
            super().__init__()
            self.field = field

        @property
        def control(self) -> SettingField:
            return self.field

    def __init__(self, spec: FieldSpec, *, label: str | None, hint: str) -> None:
        super().__init__(id=field_id(spec.path), classes="-cell" if label is None else "")
        self.spec = spec
        self._label = label
        self._hint = hint
        self._message = ""
        self._message_line: Static | None = None

    @property
    def value(self) -> object:
        """The draft value; None when the text is not a number yet."""
        raise NotImplementedError

    def load(self, value: object) -> None:
        """Show `value` without treating it as an edit, and clear any message."""
        raise NotImplementedError

    @property
    def message(self) -> str:
        """The text shown under the field ("" when none)."""
        return self._message

    def show_message(self, text: str, *, error: bool = True) -> None:
        if text == self._message:
            return
        self._message = text
        line = self._message_line
        if line is None:
            if not text:
                return
            line = self._message_line = Static(text, classes="message", markup=False)
            self.mount(line)
        else:
            line.update(text)
        line.set_class(not text, "-hidden")
        line.set_class(error, "-error")

    def clear_message(self) -> None:
        self.show_message("")

    def _control(self) -> ComposeResult:
        """The editing widget(s), between the name and the hint."""
        yield from ()

    def compose(self) -> ComposeResult:
        if self._label is not None:
            yield Label(self._label, classes="name")
        yield from self._control()
        yield Static(self._hint, classes="hint", markup=False)


class _InRange(Validator):
    def __init__(self, spec: FieldSpec) -> None:
        super().__init__()
        self.spec = spec

    def validate(self, value: str) -> ValidationResult:
        number = parse_int(value)
        message = self.spec.check(number)[1] if number is not None else f"must be {self.spec.accepted()}"
        return self.success() if message is None else self.failure(message)


class IntField(SettingField, can_focus=True):
    """An integer; the field itself is the focus stop, and `enter` or `i` edits its input."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter,i", "edit", "Edit", tooltip="Edit this field (escape leaves it)", id="settings-edit"),
        *WALK,
    ]

    def __init__(self, spec: FieldSpec, value: int, *, label: str | None, hint: str) -> None:
        super().__init__(spec, label=label, hint=hint)
        self._initial = value
        self._last_good = value
        """What the field falls back to when left empty or unreadable: its value before the edit
        (not the last valid keystroke: deleting 5000 key by key passes through 5)."""

    def _control(self) -> ComposeResult:
        width = len(str(self.spec.max)) + 2 if self.spec.max is not None else None
        yield FieldInput(
            str(self._initial),
            # Not type="integer": it drops a key it refuses without a word (2.5 typed became 25, ten
            # times what was meant). Every key shows; what is not a whole number is flagged as typed.
            type="text",
            compact=True,
            max_length=width or 0,
            validators=[_InRange(self.spec)],
            tooltip=_tooltip(self.spec),
        )

    @property
    def input(self) -> FieldInput:
        return self.query_one(FieldInput)

    def action_edit(self) -> None:
        self.input.focus()

    def on_click(self) -> None:
        self.input.focus()

    @property
    def value(self) -> int | None:
        return parse_int(self.input.value) if self.is_mounted else self._initial

    def load(self, value: object) -> None:
        assert isinstance(value, int)
        self._last_good = value
        self._set_text(str(value))
        self.clear_message()

    def _set_text(self, text: str) -> None:
        with self.prevent(Input.Changed):
            self.input.value = text

    @on(Input.Changed)
    def _typed(self, event: Input.Changed) -> None:
        event.stop()
        number = parse_int(event.value)
        if number is None:
            self.show_message(f"must be {self.spec.accepted()}")
        else:
            self.show_message(self.spec.check(number)[1] or "")
        self.post_message(self.Edited(self))

    @on(Input.Blurred)
    @on(Input.Submitted)
    def _left(self, event: Input.Blurred | Input.Submitted) -> None:
        event.stop()
        if isinstance(event, Input.Submitted):
            self.focus()  # enter keeps the value and ends editing
        number = parse_int(event.value)
        if number is None:
            self._set_text(str(self._last_good))
            self.show_message(f"restored to {self._last_good}: must be {self.spec.accepted()}")
        else:
            bounded, reason = clamp(self.spec, number)
            self._last_good = bounded
            if reason is None:
                return
            self._set_text(str(bounded))
            self.show_message(reason)
        self.post_message(self.Edited(self))


class BoolField(SettingField):
    """A switch: its checkbox is the focus stop (space or enter toggles it)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        # As on every other field: without them `j` did nothing here and `down` scrolled the card.
        *WALK,
    ]

    def __init__(self, spec: FieldSpec, value: bool, *, label: str | None, hint: str) -> None:
        super().__init__(spec, label=label, hint=hint)
        self._initial = value

    def _control(self) -> ComposeResult:
        yield Checkbox(_on_off(self._initial), self._initial, compact=True, tooltip=_tooltip(self.spec))

    @property
    def checkbox(self) -> Checkbox:
        return self.query_one(Checkbox)

    @property
    def value(self) -> bool:
        return self.checkbox.value if self.is_mounted else self._initial

    def load(self, value: object) -> None:
        assert isinstance(value, bool)
        with self.prevent(Checkbox.Changed):
            self.checkbox.value = value
        self.checkbox.label = _on_off(value)
        self.clear_message()

    @on(Checkbox.Changed)
    def _toggled(self, event: Checkbox.Changed) -> None:
        event.stop()
        self.checkbox.label = _on_off(event.value)  # the state in words, not only a mark
        self.clear_message()
        self.post_message(self.Edited(self))


def _on_off(value: bool) -> str:
    return "on" if value else "off"


class CodeListField(SettingField):
    """The error-code list: type a code and Add (or enter), select one and Remove (or delete)."""

    DEFAULT_CSS = """
    CodeListField {
        layout: vertical;
        & > .row { height: auto; }
        & > .row > .name { width: 26; }
        & > .row > .hint { width: 1fr; color: $text-muted; }
        & > .editor { height: auto; padding: 0 0 0 26; }
        /* An empty list keeps one blank line: with none, Textual counted it a row taller than it
           drew it, and the card ended a row early, over its Save and Reset buttons. */
        & OptionList { width: 12; height: auto; min-height: 3; max-height: 8; }
        & .buttons { width: 1fr; height: auto; padding: 0 0 0 1; }
        & .buttons Input { width: 12; }
        & .buttons Button { margin: 0 1 0 0; min-width: 8; }
        & .buttons Horizontal { height: auto; }
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("delete", "remove_code", "Remove code", show=False, id="settings-remove-code"),
        Binding(
            "i", "edit", "Type a code", tooltip="Type a code to add (escape leaves)", id="settings-type-code"
        ),
    ]

    def __init__(self, spec: FieldSpec, value: list[int], *, label: str | None, hint: str) -> None:
        super().__init__(spec, label=label, hint=hint)
        self._codes = list(value)

    def compose(self) -> ComposeResult:
        with Horizontal(classes="row"):
            yield Label(self._label or self.spec.name, classes="name")
            yield Static(self._hint, classes="hint", markup=False)
        with Horizontal(classes="editor"):
            codes = OptionList(*(str(code) for code in self._codes))
            codes.tooltip = _tooltip(self.spec)
            yield codes
            with Vertical(classes="buttons"):
                yield FieldInput(
                    placeholder="code", type="text", compact=True, max_length=4, classes="new-code"
                )
                with Horizontal():
                    yield WalkButton("Add", compact=True, classes="add")
                    yield WalkButton("Remove", compact=True, classes="remove")

    @property
    def value(self) -> list[int]:
        return list(self._codes)

    @property
    def codes_list(self) -> OptionList:
        return self.query_one(OptionList)

    @property
    def code_input(self) -> FieldInput:
        return self.query_one(".new-code", FieldInput)

    def load(self, value: object) -> None:
        assert isinstance(value, list)
        self._codes = [int(code) for code in value]
        self._redraw()
        self.clear_message()

    def _redraw(self) -> None:
        options = self.codes_list
        highlighted = options.highlighted
        options.set_options(str(code) for code in self._codes)
        if self._codes:
            options.highlighted = min(highlighted or 0, len(self._codes) - 1)

    def add_code(self, text: str) -> bool:
        """Add a typed code to the draft; False (with the reason shown) if it is not acceptable."""
        code = parse_int(text)
        if code is None or not (self.spec.min or 0) <= code <= (self.spec.max or code):
            self.show_message(
                f"not added: each code must be an integer between {self.spec.min} and {self.spec.max}"
            )
            return False
        if code in self._codes:
            self.show_message(f"{code} is already in the list", error=False)
            return False
        if len(self._codes) >= INT_LIST_MAX_ITEMS:
            self.show_message(f"not added: at most {INT_LIST_MAX_ITEMS} codes")
            return False
        self._codes.append(code)
        self._redraw()
        self.codes_list.highlighted = len(self._codes) - 1
        self.clear_message()
        self.post_message(self.Edited(self))
        return True

    def remove_selected(self) -> int | None:
        """Remove the highlighted code from the draft and return it (None if nothing is selected)."""
        index = self.codes_list.highlighted
        if index is None or not self._codes:
            self.show_message("select a code to remove", error=False)
            return None
        code = self._codes.pop(index)
        self._redraw()
        self.show_message("no codes: saving uses the defaults" if not self._codes else "", error=False)
        self.post_message(self.Edited(self))
        return code

    @on(Button.Pressed, ".add")
    @on(Input.Submitted, ".new-code")
    def _add(self, event: Button.Pressed | Input.Submitted) -> None:
        event.stop()
        if self.add_code(self.code_input.value):
            self.code_input.value = ""

    @on(Button.Pressed, ".remove")
    def _remove(self, event: Button.Pressed) -> None:
        event.stop()
        self.remove_selected()

    @on(Input.Changed, ".new-code")
    @on(Input.Blurred, ".new-code")
    def _typing_code(self, event: Input.Changed | Input.Blurred) -> None:
        event.stop()  # the code being typed is not part of the draft until added

    def action_remove_code(self) -> None:
        self.remove_selected()

    def action_edit(self) -> None:
        self.code_input.focus()


def make_field(spec: FieldSpec, value: object, *, label: str | None) -> SettingField:
    """The widget for one schema field; `label=None` for a grid cell (short hint: the row gives the range)."""
    default = f"default {format_default(spec)}"
    hint = default if label is None else f"{default} · {format_range(spec)}"
    if spec.kind == "bool":
        assert isinstance(value, bool)
        return BoolField(spec, value, label=label, hint=hint)
    if spec.kind == "int":
        assert isinstance(value, int)
        return IntField(spec, value, label=label, hint=hint)
    assert isinstance(value, list)
    limits = f"{format_range(spec)}, at most {INT_LIST_MAX_ITEMS}; none = the default"
    return CodeListField(spec, value, label=label, hint=f"{default}\n{limits}")
