"""One settings card: a draft of some settings sections, saved through the API's own validation.

The card keeps three things: `base` (the values the draft started from), `live` (the runtime's
values as last read) and the draft (what its fields show). `ctrl+s` sends only the fields the
operator changed (draft against base) as one partial PATCH of the card's group, so a value changed
elsewhere meanwhile (the CLI, the API) is never written back over (one the operator edited too is
written only by a second ctrl+s, after the first named it); the runtime applies exactly the
checks `PATCH /api/resilience` (or `/api/settings`) applies, and an invalid draft changes nothing.
Fields changed elsewhere since the draft began are named in the status line until the draft ends.
`escape` reloads the live values; "Reset defaults" loads the schema defaults into the draft only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Button, Static
from textual.worker import Worker, WorkerState

from omniroute_tui.cards.catalog import CLASS_LABELS, Block, CardSpec, Explainer, format_range, get_path, nest
from omniroute_tui.cards.fields import FieldInput, SettingField, WalkButton, make_field
from proxy.resilience.errors import FieldError, SettingsError
from proxy.resilience.outcome import PROVIDER_CLASSES
from proxy.settings import defaults, leaves, said

if TYPE_CHECKING:
    from proxy.readmodel import Event
    from proxy.runtime import Runtime

__all__ = ["READ_ONLY_NOTE", "RuntimeSettings", "SettingsCard", "SettingsSource"]


class SettingsSource(Protocol):
    """Where the cards read and write the settings: the hosted runtime, or an instance's API."""

    def document(self, group: str) -> dict[str, Any]: ...

    async def patch(self, patch: Mapping[str, Any], group: str) -> dict[str, Any]:
        """The group's document once the change is saved and live; SettingsError for bad fields."""
        ...

    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]: ...


class RuntimeSettings:
    """The hosted console's settings: the runtime's own, in-process."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def document(self, group: str) -> dict[str, Any]:
        return self._runtime.settings.document(group)

    async def patch(self, patch: Mapping[str, Any], group: str) -> dict[str, Any]:
        return await self._runtime.patch_settings(patch, group, source="tui")

    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        return self._runtime.bus.subscribe(listener)


READ_ONLY_NOTE = (
    "Read-only: the console was started with --read-only, so settings can be viewed, not changed."
)


class SettingsCard(Vertical):
    DEFAULT_CSS = """
    SettingsCard {
        height: auto;
        border: round $panel-lighten-2;
        border-title-style: bold;
        border-subtitle-color: $text-warning;
        padding: 0 1;
        & .block-title { text-style: bold underline; }
        & .explainer { color: $text-muted; margin-bottom: 1; }
        & .grid-head, & .grid-row { height: auto; }
        & .grid-row { margin-bottom: 1; }
        & .row-name { width: 24; }
        & .col-head { width: 1fr; text-style: bold; }
        & .grid-row SettingField { padding: 0 1 0 0; }
        & .status { margin-top: 1; color: $text-muted; }
        & .status.-error { color: $text-error; }
        & .status.-dirty { color: $text-warning; }
        & .actions { height: auto; }
        & .actions Button { margin: 0 1 0 0; min-width: 8; }
    }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+s", "save", "Save card", tooltip="Save this card's draft", id="settings-save"),
        Binding(
            "escape", "discard", "Discard draft", tooltip="Back to the live values", id="settings-discard"
        ),
    ]

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """`escape` discards a draft: offered (in the key bar, too) only while there is one."""
        if action == "discard":
            return self.dirty
        return True

    class Saved(Message):
        """A draft was applied and persisted; `document` is the group's settings after it."""

        def __init__(self, card: SettingsCard, patch: dict[str, Any], document: dict[str, Any]) -> None:
            super().__init__()
            self.card = card
            self.patch = patch
            self.document = document

        @property
        def control(self) -> SettingsCard:
            return self.card

    def __init__(self, spec: CardSpec, source: SettingsSource, *, read_only: bool = False) -> None:
        super().__init__(id=f"card-{spec.id}")
        self.spec = spec
        self.read_only = read_only
        self._source = source
        self.live: dict[str, object] = self._read_live()
        """The runtime's values as last read, by dotted path."""
        self.base: dict[str, object] = dict(self.live)
        """The values the draft started from: what the operator's edits are measured against."""
        self._note = ""
        self._note_kind = ""
        self._editing: str | None = None
        self._overwrite: frozenset[str] = frozenset()
        """Fields edited here and changed elsewhere whose overwrite the operator was warned about
        (a first ctrl+s names them and saves nothing; a second writes the operator's values)."""
        """The path of the field whose input has the focus (being typed into), if any."""
        self._status_text = ""
        self.border_title = spec.title

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        for block in self.spec.blocks:
            if block.title:
                yield Static(block.title, classes="block-title")
            yield Static(_explain(block.explainer), classes="explainer")
            yield from self._block_fields(block)
        yield Static("", classes="status")
        with Horizontal(classes="actions"):
            yield WalkButton("Save", compact=True, classes="save", disabled=self.read_only)
            yield WalkButton(
                "Reset defaults", compact=True, classes="reset-defaults", disabled=self.read_only
            )

    def _block_fields(self, block: Block) -> Iterable[Any]:
        if not block.per_class:
            for spec in block.specs():
                yield self._field(make_field(spec, self.live[spec.path], label=spec.name))
            return
        with Horizontal(classes="grid-head"):
            yield Static("", classes="row-name")
            for cls in PROVIDER_CLASSES:
                yield Static(CLASS_LABELS[cls], classes="col-head")
        for name in block.row_names():
            with Horizontal(classes="grid-row"):
                yield Static(
                    Text.assemble(name, "\n", (format_range(block.cell(name, "oauth")), "dim")),
                    classes="row-name",
                )
                for cls in PROVIDER_CLASSES:
                    spec = block.cell(name, cls)
                    yield self._field(make_field(spec, self.live[spec.path], label=None))

    def _field(self, field: SettingField) -> SettingField:
        field.disabled = self.read_only
        return field

    def on_mount(self) -> None:
        self._show_status()

    # ------------------------------------------------------------------ state

    @property
    def fields(self) -> dict[str, SettingField]:
        """The card's fields by dotted path."""
        return {field.spec.path: field for field in self.query(SettingField)}

    def draft(self) -> dict[str, object]:
        """What the fields show, by dotted path (None for an integer field that holds no number)."""
        return {path: field.value for path, field in self.fields.items()}

    @property
    def dirty(self) -> bool:
        """The draft differs from the values it started from."""
        return self.draft() != self.base

    def edits(self) -> dict[str, object]:
        """The fields the operator changed, by dotted path: what a save sends."""
        base = self.base
        return {path: value for path, value in self.draft().items() if value != base[path]}

    @property
    def changed_elsewhere(self) -> list[str]:
        """Fields whose live value moved since the draft began (the CLI, the API, another card)."""
        return [path for path, value in self.live.items() if value != self.base[path]]

    def _read_live(self) -> dict[str, object]:
        document = self._source.document(self.spec.group)
        return {spec.path: get_path(document, spec.path) for spec in self.spec.specs()}

    def load(self, values: Mapping[str, object]) -> None:
        """Show `values` as the live state: the draft becomes clean."""
        self.live = dict(values)
        self.base = dict(values)
        self._overwrite = frozenset()
        for path, field in self.fields.items():
            field.load(values[path])

    def refresh_live(self) -> None:
        """The runtime's settings changed (a PATCH over the API, the CLI, another card).

        A card without a draft follows at once; a card with one keeps it, marks the fields that
        changed underneath and names them (escape loads them; ctrl+s saves only the operator's own
        edits, so it never writes them back)."""
        live = self._read_live()
        if live == self.live:
            return
        if not self.dirty:
            self.load(live)
            self._set_note("Updated from a change made elsewhere.")
            return
        self.live = live
        fields = self.fields
        for path in self.changed_elsewhere:
            fields[path].show_message(f"changed elsewhere to {said(live[path])}")
        self._show_status()

    # ------------------------------------------------------------------ status line

    def _set_note(self, text: str, kind: str = "") -> None:
        self._note, self._note_kind = text, kind
        self._show_status()

    def _show_status(self) -> None:
        if not self.is_mounted:
            return
        line = self.query_one(".status", Static)
        dirty = self.dirty
        subtitle = "● unsaved draft" if dirty else ""
        if self.border_subtitle != subtitle:
            self.border_subtitle = subtitle
            self.refresh_bindings()  # escape discards a draft only while there is one
        if self.read_only:
            text, kind = READ_ONLY_NOTE, ""
        elif self._note:
            text, kind = self._note, self._note_kind
        elif dirty:
            text, kind = "Unsaved draft: ctrl+s saves this card, escape discards it.", "-dirty"
        else:
            text, kind = "Live values. ctrl+s saves the card, escape discards a draft.", ""
        if self._editing is not None and not self.read_only and not self._note:
            text = f"Editing {self._editing}: enter keeps the value, escape leaves the field. {text}"
        elsewhere = self.changed_elsewhere if dirty else []
        if elsewhere:  # said until the draft ends, a rejected save included
            edited = self.edits()
            kept = [path for path in elsewhere if path not in edited]
            both = [path for path in elsewhere if path in edited]
            if kept:
                text += f" Changed elsewhere meanwhile (not overwritten by a save): {', '.join(kept)}."
            if both:
                text += f" Changed elsewhere meanwhile, and edited here: {', '.join(both)}."
        if text != self._status_text:  # an update re-lays out the screen: not on every keystroke
            self._status_text = text
            line.update(text)
        line.set_class(kind == "-error", "-error")
        line.set_class(kind == "-dirty", "-dirty")

    @property
    def status(self) -> str:
        """The status line's text."""
        return self._status_text

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        self._follow_editing(event.widget)

    def on_descendant_blur(self, event: events.DescendantBlur) -> None:
        self._follow_editing(None)

    def _follow_editing(self, focused: Widget | None) -> None:
        editing = None
        if isinstance(focused, FieldInput):
            owner = next((a for a in focused.ancestors if isinstance(a, SettingField)), None)
            editing = owner.spec.path if owner is not None else None
        if editing != self._editing:
            self._editing = editing
            self._show_status()

    @on(SettingField.Edited)
    def _edited(self, event: SettingField.Edited) -> None:
        event.stop()
        self._note = ""
        self._show_status()

    # ------------------------------------------------------------------ actions

    @on(Button.Pressed, ".save")
    def _save_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_save()

    @on(Button.Pressed, ".reset-defaults")
    def _reset_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_reset_defaults()

    def action_save(self) -> None:
        if self.read_only:
            self._set_note(READ_ONLY_NOTE)
            return
        fields = self.fields
        unreadable = [path for path, value in self.draft().items() if value is None]
        for path in unreadable:
            fields[path].show_message(f"must be {fields[path].spec.accepted()}")
        if unreadable:
            self._set_note("Not saved: a field holds no number. Nothing changed.", "-error")
            return
        changes = self.edits()
        if not changes:
            self.load(self._read_live())
            self._set_note("Nothing to save: the card matches the live settings.")
            return
        live, base = self.live, self.base
        both = frozenset(path for path in changes if live[path] != base[path])
        if both - self._overwrite:
            self._overwrite = both
            theirs = ", ".join(f"{path} to {said(live[path])}" for path in sorted(both))
            self._set_note(
                f"Not saved: changed elsewhere while you edited it ({theirs}). ctrl+s again writes "
                "your values over it, escape loads the live ones.",
                "-error",
            )
            return
        self._set_note("Saving…")
        self.save(nest(changes))

    @work(exclusive=True, group="settings", exit_on_error=False)
    async def save(self, patch: dict[str, Any]) -> None:
        """Apply `patch` to the card's group and persist it; field errors show on their fields."""
        try:
            document = await self._source.patch(patch, self.spec.group)
        except SettingsError as exc:
            self._show_errors(exc.fields)
            return
        self.load({spec.path: get_path(document, spec.path) for spec in self.spec.specs()})
        self._set_note("Saved.")
        # The note may be off screen (a tall card at 80x24): a toast says it too, and the note scrolls in.
        self.notify(f"Saved {self.spec.title}: {', '.join(leaves(patch))}", title="Settings", markup=False)
        self.query_one(".status", Static).scroll_visible(animate=False)
        self.post_message(self.Saved(self, patch, document))

    def _show_errors(self, errors: list[FieldError]) -> None:
        fields = self.fields
        elsewhere = []
        for error in errors:
            if error.field in fields:
                fields[error.field].show_message(error.message)
            else:
                elsewhere.append(f"{error.field}: {error.message}")
        count = len(errors)
        text = f"Not saved: {count} field{'s' if count != 1 else ''} rejected. Nothing changed."
        if elsewhere:
            text += " " + "; ".join(elsewhere)
        self._set_note(text, "-error")

    @on(Worker.StateChanged)
    def _worker_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "settings":
            return
        event.stop()
        if event.state == WorkerState.ERROR:
            self._set_note(f"Save failed: {event.worker.error}", "-error")
        elif event.state == WorkerState.CANCELLED:
            self._set_note("Save interrupted: check the live values.", "-error")

    def action_discard(self) -> None:
        self.load(self._read_live())
        self._set_note("Draft discarded: showing the live values.")

    def action_reset_defaults(self) -> None:
        if self.read_only:
            return
        document = defaults()
        for path, field in self.fields.items():
            field.load(get_path(document, path))
        self._set_note("Defaults loaded into the draft: ctrl+s saves them, escape discards.", "-dirty")


def _explain(explainer: Explainer) -> Text:
    return Text.assemble(
        ("Scope: ", "bold"),
        explainer.scope,
        "\n",
        ("Trigger: ", "bold"),
        explainer.trigger,
        "\n",
        ("Effect: ", "bold"),
        explainer.effect,
    )
