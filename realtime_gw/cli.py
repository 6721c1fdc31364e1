"""``realtime-gw serve``: every config field is also a flag (``--tts tone``, ``--openpi-tracebacks``)."""

from __future__ import annotations

import argparse
import logging
import sys
import typing
from typing import Any

import msgspec

from realtime_gw.config import FIELDS, ConfigError, GatewayConfig, load_config


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    hints = typing.get_type_hints(GatewayConfig)
    for name in FIELDS:
        flag = "--" + name.replace("_", "-")
        hint = hints[name]
        if hint is bool or set(typing.get_args(hint)) == {bool, type(None)}:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None)
        elif typing.get_origin(hint) is list:
            parser.add_argument(
                flag, dest=name, default=None, action=_ListItems, help="repeatable (or one JSON list)"
            )
        else:
            choices = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else None
            parser.add_argument(flag, dest=name, default=None, choices=choices)


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
    parser = argparse.ArgumentParser(prog="realtime-gw", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", default=None, help="TOML config file")
    _add_config_flags(serve)
    from realtime_gw.client.commands import add_client_commands  # light: argparse only until run

    add_client_commands(sub)
    return parser


def serve(args: argparse.Namespace) -> None:
    from realtime_gw.app import create_app
    from realtime_gw.app import serve as serve_app

    overrides: dict[str, Any] = {k: getattr(args, k) for k in FIELDS}
    try:
        config = load_config(args.config, overrides=overrides)
    except (msgspec.ValidationError, msgspec.DecodeError, OSError) as e:
        sys.exit(f"realtime-gw: bad configuration: {e}")
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
    else:
        sys.exit(args.func(args))
