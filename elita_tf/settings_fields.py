"""Settings fields that own their default, help text and check: `setting`, and what reads them.

A field of `TrainSettings` or `CorpusSettings` is written once, with everything said about it:

    dropout: float = setting(None, "Dropout rate in training ...", check=check_dropout, model="dropout")

The settings check it when made (`check_fields`), the command lines make its flag and `--help` from it
(`elita_tf.cli.flags`), and its class docstring's `Attributes:` section is written from it
(`with_attributes`). No TensorFlow.
"""

import dataclasses
import textwrap

from elita_tf.checks import check_choice


def setting(default=dataclasses.MISSING, help=None, *, check=None, choices=None, default_help=None, **marks):
    """A dataclass field with its help text and check in its metadata.

    Args:
        default: the default value; a dataclass type (`CorpusSettings`)
            becomes its `default_factory`. Missing: the field is required.
        help: str. What the field is, one text for the docstring and
            `--help`. A field of the same class in backticks (`` `init_from` ``)
            reads as its flag (`--init-from`) in `--help`.
        check: optional `check(name, value)` from `elita_tf.checks`, run
            when the settings are made (not on None where None is the default).
        choices: optional tuple of the values the field takes (the check,
            and the flag's choices).
        default_help: optional str, what the default means where its value
            does not say it (`"the size's"`).
        **marks: further metadata (`model="dropout"`, `run=True`, `local=True`).

    Example:
    >>> @dataclasses.dataclass(frozen=True)
    ... class Run:
    ...     steps: int = setting(10, "Steps in all.", choices=(10, 100))
    ...     def __post_init__(self):
    ...         check_fields(self)
    >>> dataclasses.fields(Run)[0].metadata["help"]
    'Steps in all.'
    >>> Run(steps=5)
    Traceback (most recent call last):
    ValueError: `steps` must be one of [10, 100]. Received: steps=5
    """
    metadata = {"help": help, "check": check, "choices": choices, "default_help": default_help, **marks}
    if isinstance(default, type) and dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=default, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def setting_like(settings_class, name, default=None, **changes):
    """A field with the help text and check of `settings_class`'s field `name`, written there once; `default`
    and `changes` (`default_help="the run's"`) are its own.

    Example:
    >>> @dataclasses.dataclass(frozen=True)
    ... class Run:
    ...     steps: int = setting(10, "Steps in all.")
    >>> like = setting_like(Run, "steps", default_help="the run's")
    >>> like.default, like.metadata["help"], like.metadata["default_help"]
    (None, 'Steps in all.', "the run's")
    """
    metadata = field_named(settings_class, name).metadata
    shared = {key: metadata[key] for key in ("help", "check", "choices", "default_help")}
    return setting(default, **{**shared, **changes})


def field_named(settings_class, name):
    """The `dataclasses.Field` `name` of `settings_class`."""
    return {field.name: field for field in dataclasses.fields(settings_class)}[name]


def check_field(settings_class, name, value, shown_as=None):
    """Runs field `name`'s check (and choices) on `value`, naming it `shown_as` (default: `name`)."""
    field = field_named(settings_class, name)
    if value is None and field.default is None:
        return
    if field.metadata.get("choices") is not None:
        check_choice(shown_as or name, value, field.metadata["choices"])
    if field.metadata.get("check") is not None:
        field.metadata["check"](shown_as or name, value)


def check_fields(settings):
    """Runs every field's check on a settings object (from its `__post_init__`)."""
    for field in dataclasses.fields(settings):
        check_field(type(settings), field.name, getattr(settings, field.name))


def default_text(field):
    """What a field's default is, in words, or None for a required field or a None without a `default_help`."""
    if field.metadata.get("default_help"):
        return field.metadata["default_help"]
    if field.default is dataclasses.MISSING or field.default is None:
        return None
    return f"`{field.default!r}`"


def _type_name(field):
    name = getattr(field.type, "__name__", str(field.type))
    return f"{name} or None" if field.default is None else name


def with_attributes(settings_class):
    """Class decorator: the docstring's `Attributes:` section, written from each field's help, before `Example:`.

    Raises:
        ValueError: naming a field without help.
    """
    lines = []
    for field in dataclasses.fields(settings_class):
        if not field.metadata.get("help"):
            raise ValueError(f"Every settings field has help. Received: {settings_class.__name__}.{field.name}")
        default = default_text(field)
        text = f"{field.name}: {_type_name(field)}. {field.metadata['help']}"
        text += "" if default is None else f" Defaults to {default}."
        lines += textwrap.wrap(
            text, 108, initial_indent=" " * 8, subsequent_indent=" " * 12, break_on_hyphens=False
        )
    head, _, example = settings_class.__doc__.rstrip().partition("\n    Example:")
    example = f"\n\n    Example:{example}" if example else ""
    settings_class.__doc__ = head.rstrip() + "\n\n    Attributes:\n" + "\n".join(lines) + example + "\n    "
    return settings_class
