"""``realtime-gw``: run the gateway (``serve``), print its settings (``config --show``), or talk to one
(``say``, ``talk``, ``robot``). Every setting is also a flag of ``serve`` (``--tts tone``,
``--openpi-tracebacks``); building this parser imports nothing heavy (no numpy, torch or websockets)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import typing
from typing import Any

import msgspec

from realtime_gw.config import FIELDS, ConfigError, GatewayConfig, load_config, to_toml
from realtime_gw.config.sections import SECTIONS, field_docs, plain

SETTINGS_EPILOG = (
    "Each setting is also a variable REALTIME_GW_<FIELD> (REALTIME_GW_TTS_DEVICE=cuda) and a key of the "
    '--config TOML file, in its section ([tts] device = "cuda") or flat (tts_device = "cuda"). '
    "Precedence: defaults < file < environment < flags. 'realtime-gw config --show' prints the result."
)


def _default_text(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, str)):
        return msgspec.json.encode(value).decode()
    return str(value)


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per config field, in one argument group per section, each with its field's docstring."""
    hints = typing.get_type_hints(GatewayConfig)
    docs = field_docs()
    defaults = GatewayConfig()
    for section in SECTIONS:
        group = parser.add_argument_group(f"[{section.name}]", section.doc)
        for name in section.fields:
            flag = "--" + name.replace("_", "-")
            hint = hints[name]
            is_list = typing.get_origin(hint) is list
            text = plain(docs.get(name, "")) + (" Repeatable, or one JSON list." if is_list else "")
            text += f" (default: {_default_text(getattr(defaults, name))})"
            text = text.replace("%", "%%")  # argparse formats help with %
            if hint is bool or set(typing.get_args(hint)) == {bool, type(None)}:
                group.add_argument(
                    flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=text
                )
            elif is_list:
                group.add_argument(
                    flag, dest=name, default=None, action=_ListItems, metavar="ITEM", help=text
                )
            else:
                choices = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else None
                group.add_argument(flag, dest=name, default=None, choices=choices, help=text)


class _ListItems(argparse.Action):
    """A list setting: each use of the flag adds one item (``--tts-voice-clone anna=a.wav
    --tts-voice-clone bob=b.wav``); a value that is a JSON list (``'["a", "b"]'``) adds its items."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, value: Any, *_: Any
    ) -> None:
        items = list(getattr(namespace, self.dest) or [])
        if isinstance(value, str) and value.lstrip().startswith("["):
            try:
                items += msgspec.json.decode(value)
            except msgspec.DecodeError as e:
                parser.error(f"{self.option_strings[0]}: not a JSON list: {e}")
        else:
            items.append(value)
        setattr(namespace, self.dest, items)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="realtime-gw",
        description="A gateway serving the OpenAI Realtime API and the OpenPI robot socket, and its clients.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the gateway",
        usage="realtime-gw serve [-h] [--config FILE] [SETTING FLAGS ...]",
        description="Run the gateway. Its settings follow, section by section.",
        epilog=SETTINGS_EPILOG,
    )
    serve.add_argument("--config", default=None, metavar="FILE", help="TOML config file")
    _add_config_flags(serve)
    config = sub.add_parser(
        "config",
        help="print the effective settings as TOML",
        usage="realtime-gw config [-h] --show [--secrets] [--config FILE] [SETTING FLAGS ...]",
        description="Print the settings 'serve' would run with (same file, environment and flags) as "
        "sectioned TOML that --config reads back.",
        epilog=SETTINGS_EPILOG,
    )
    config.add_argument("--show", action="store_true", required=True, help="print the effective config")
    config.add_argument("--secrets", action="store_true", help="print credentials too (api_key, ...)")
    config.add_argument("--config", default=None, metavar="FILE", help="TOML config file")
    _add_config_flags(config)
    from realtime_gw.client.commands import add_client_commands  # light: argparse only until run

    add_client_commands(sub)
    return parser


def effective_config(args: argparse.Namespace) -> GatewayConfig:
    """The config ``args`` ask for (file, environment, flags); a bad one exits with its message."""
    overrides: dict[str, Any] = {k: getattr(args, k) for k in FIELDS}
    try:
        return load_config(args.config, overrides=overrides)
    except (msgspec.ValidationError, msgspec.DecodeError, OSError) as e:
        sys.exit(f"realtime-gw: bad configuration: {e}")


def serve(args: argparse.Namespace) -> None:
    from realtime_gw.app import create_app
    from realtime_gw.app import serve as serve_app

    config = effective_config(args)
    if config.webrtc_client_secret_key_file and hasattr(signal, "SIGHUP"):
        # a fleet's key rotation sends SIGHUP: until the app takes it (re-reads the key file), it is ignored,
        # not the default that ends the process (a gateway still loading its models would die)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        app = create_app(config)
    except ConfigError as e:  # e.g. a policy checkpoint that does not match its tokenizer or statistics
        sys.exit(f"realtime-gw: {e}")
    serve_app(app, config)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        serve(args)
    elif args.command == "config":
        sys.stdout.write(to_toml(effective_config(args), secrets=args.secrets))
    else:
        sys.exit(args.func(args))
