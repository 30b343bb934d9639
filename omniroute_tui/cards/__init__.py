"""The Settings tab: cards that mirror OmniRoute's dashboard, built from `proxy.settings.SCHEMA`."""

from omniroute_tui.cards.card import SettingsCard
from omniroute_tui.cards.catalog import CARDS, CardSpec
from omniroute_tui.cards.pane import SettingsPane

__all__ = ["CARDS", "CardSpec", "SettingsCard", "SettingsPane"]
