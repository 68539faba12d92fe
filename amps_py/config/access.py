"""Who may log on and what they may do: ``Authentication`` and ``Entitlement`` (of the
instance and of the replication transport), and the ``Authenticator`` a replication
destination logs on with."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from lxml import etree

from amps_py import auth
from amps_py.config.credentials import (
    AMPS_DEFAULT_LINK_AUTHENTICATOR,
    DEFAULT_LINK_AUTHENTICATOR,
    PASSWORD_LINK_AUTHENTICATOR,
    LinkAuthenticator,
    LinkCredentialsError,
    read_password_file,
)
from amps_py.config.model import AuthenticationConfig, EntitlementConfig
from amps_py.config.problems import _Problems
from amps_py.config.values import _PATH_HINT, _text
from amps_py.config.xmltree import _first, _line

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LINK_USER = re.compile(r"[^\s:]+")
_AUTHENTICATOR_EXAMPLE = (
    "<Options><Username>repl</Username><PasswordEnv>REPL_PW</PasswordEnv></Options>"
)


#: the options of each Authenticator module: (user option, password sources)
_AUTHENTICATOR_OPTIONS: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    PASSWORD_LINK_AUTHENTICATOR: ("Username", ("Password", "PasswordFile", "PasswordEnv")),
    AMPS_DEFAULT_LINK_AUTHENTICATOR: (
        "User",
        ("Password", "PasswordFileName", "PasswordEnvironmentVariable"),
    ),
}
#: what each option is called by the other module that takes the same setting
_SAME_OPTION: Final = {
    "Username": "User",
    "User": "Username",
    "PasswordFile": "PasswordFileName",
    "PasswordFileName": "PasswordFile",
    "PasswordEnv": "PasswordEnvironmentVariable",
    "PasswordEnvironmentVariable": "PasswordEnv",
}
_ALL_AUTHENTICATOR_OPTIONS: Final = (
    "Username",
    "User",
    "Password",
    "PasswordFile",
    "PasswordFileName",
    "PasswordEnv",
    "PasswordEnvironmentVariable",
)


def _link_authenticator(el: etree._Element, problems: _Problems) -> LinkAuthenticator | None:
    """The ``Destination/Transport/Authenticator``; None (and problems) when wrong.

    Never puts a password in a problem: messages name the elements only.
    """
    module = _text(_first(el, "Module"), problems)
    options = _first(el, "Options")
    given = {
        tag: option
        for tag in _ALL_AUTHENTICATOR_OPTIONS
        if (option := _first(options, tag)) is not None
    }
    if module is None or problems.faulty(el):
        return None
    if module == DEFAULT_LINK_AUTHENTICATOR:
        return _default_authenticator(given, problems)
    user_tag, password_tags = _AUTHENTICATOR_OPTIONS[module]
    ok = _only_options_of(module, (user_tag, *password_tags), given, problems)
    sources = [given[t] for t in password_tags if t in given]
    ok = _one_source(sources, problems) and ok
    if module == AMPS_DEFAULT_LINK_AUTHENTICATOR:
        # AMPS's default: the User is optional (the process's user), and so is a password
        user_ok, user = _link_username(el, options, given.get(user_tag), problems, required=False)
        ok = user_ok and ok
    else:
        user_ok, user = _link_username(el, options, given.get(user_tag), problems)
        ok = user_ok and ok
        if not sources:
            problems.add(
                options if options is not None else el,
                f"the {PASSWORD_LINK_AUTHENTICATOR} module needs a password: one of "
                "Options/Password, Options/PasswordFile or Options/PasswordEnv",
                f"add one, e.g. {_AUTHENTICATOR_EXAMPLE}",
            )
            return None
    if not ok or problems.faulty(el):
        return None
    if not sources:
        return LinkAuthenticator(module, user)
    value = _text(sources[0], problems)
    if value is None:
        return None
    return _password_authenticator(module, sources[0], user, value, problems)


def _only_options_of(
    module: str,
    allowed: tuple[str, ...],
    given: Mapping[str, etree._Element],
    problems: _Problems,
) -> bool:
    """Whether ``given`` holds only options ``module`` reads; a problem for each other
    (most are another module's spelling of the same setting)."""
    ok = True
    for tag, option in given.items():
        if tag in allowed:
            continue
        same = _SAME_OPTION.get(tag)
        fix = (
            f"write <{same}> instead: that is how the {module} module names this setting"
            if same in allowed
            else f"remove <{tag}>"
        )
        problems.add(option, f"<{tag}> is not an option of the {module} module", fix)
        ok = False
    return ok


def _one_source(sources: list[etree._Element], problems: _Problems) -> bool:
    """Whether at most one password source is given (a problem for each extra one)."""
    for extra in sources[1:]:
        problems.add(
            extra,
            f"<{extra.tag}> is given as well as <{sources[0].tag}> (line {_line(sources[0])}); "
            "an Authenticator takes exactly one password source",
            f"keep one of the password options and remove <{extra.tag}>",
        )
    return len(sources) <= 1


def _default_authenticator(
    given: Mapping[str, etree._Element], problems: _Problems
) -> LinkAuthenticator | None:
    """The default module, which sends no credentials: none may be ``given``."""
    for tag, option in given.items():
        problems.add(
            option,
            f"<{tag}> is only used by the {PASSWORD_LINK_AUTHENTICATOR} and "
            f"{AMPS_DEFAULT_LINK_AUTHENTICATOR} modules; "
            f"{DEFAULT_LINK_AUTHENTICATOR} sends no credentials",
            f"remove <{tag}>, or set <Module>{AMPS_DEFAULT_LINK_AUTHENTICATOR}</Module> "
            "(AMPS's default authenticator) to log on with a user and password",
        )
    return None if given else LinkAuthenticator(DEFAULT_LINK_AUTHENTICATOR)


def _link_username(
    el: etree._Element,
    options: etree._Element | None,
    user_el: etree._Element | None,
    problems: _Problems,
    *,
    required: bool = True,
) -> tuple[bool, str | None]:
    """(ok, the user option's text): it must be a user name, and given when
    ``required`` (the password module's Username; AMPS's default module's User is
    optional)."""
    username = _text(user_el, problems)
    if user_el is None:
        if not required:
            return True, None
        problems.add(
            options if options is not None else el,
            f"the {PASSWORD_LINK_AUTHENTICATOR} module needs Options/Username",
            f"add the user the link logs on as, e.g. {_AUTHENTICATOR_EXAMPLE}",
        )
        return False, username
    if username is not None and not _LINK_USER.fullmatch(username):
        problems.add(
            user_el,
            f"{user_el.tag} {username!r} contains whitespace or ':', which no user name can",
            "give the user name as written in the remote instance's password file",
        )
        return False, username
    return username is not None, username


def _password_authenticator(
    module: str, source: etree._Element, username: str | None, value: str, problems: _Problems
) -> LinkAuthenticator | None:
    """``module`` with its one password ``source`` (Password, an environment variable or
    a file option, whose text is ``value``); a password file is read now to check it."""
    if source.tag == "Password":
        return LinkAuthenticator(module, username, password=value)
    if source.tag in ("PasswordEnv", "PasswordEnvironmentVariable"):
        if not _ENV_NAME.fullmatch(value):
            problems.add(
                source,
                # the value is not echoed: it may well be the password itself
                f"{source.tag} is not an environment variable name",
                "give the variable's name (letters, digits and _, not starting with a "
                "digit), e.g. REPL_PW, not its value or ${...}",
            )
            return None
        return LinkAuthenticator(module, username, password_env=value)
    path = Path(value)
    try:
        read_password_file(path)
    except LinkCredentialsError as exc:
        looked = "" if path.is_absolute() else f" (looked for in {Path.cwd()})"
        problems.add(
            source,
            f"{exc}{looked}",
            "give a file readable by the user that runs amps-py whose first line is the "
            f"password; {_PATH_HINT.replace('NAME.pem', 'NAME')}",
        )
        return None
    return LinkAuthenticator(module, username, password_file=path)


def _module_file(
    section: etree._Element,
    option: str,
    wants_file: str,
    what: str,
    load: Callable[[Path], object],
    problems: _Problems,
) -> tuple[str | None, Path | None]:
    """(Module, path of Options/<option>) of an Authentication/Entitlement element.

    ``wants_file`` is the module that needs the file; any other module must not have
    it. The file is loaded with ``load`` so that a missing or malformed file is a
    configuration problem now rather than a failure at start-up.
    """
    tag = str(section.tag)
    module_el = _first(section, "Module")
    module = _text(module_el, problems)
    file_el = _first(_first(section, "Options"), option)
    text = _text(file_el, problems)
    if module is None:
        return None, None
    if module != wants_file:
        if file_el is not None and text:
            problems.add(
                file_el,
                f"Options/{option} is only used by the {wants_file} module, not by {module}",
                f"remove <{option}>, or set <Module>{wants_file}</Module>",
            )
        return module, None
    if file_el is None:
        problems.add(
            section,
            f"<{tag}> with Module {wants_file} needs Options/{option}",
            f"add <Options><{option}>FILE</{option}></Options> naming the {what}",
        )
        return module, None
    if not text:
        return module, None
    path = Path(text)
    try:
        load(path)
    except auth.AuthFileError as exc:
        where = exc.path if exc.line is None else f"{exc.path}:{exc.line}"
        looked = "" if path.is_absolute() else f" (looked for in {Path.cwd()})"
        problems.add(
            file_el,
            f"{option} {where}: {exc.message}{looked if exc.line is None else ''}",
            f"{exc.fix}; {_PATH_HINT.replace('NAME.pem', 'NAME')}",
        )
        return module, None
    return module, path


def _build_authentication(root: etree._Element, problems: _Problems) -> AuthenticationConfig:
    section = _first(root, "Authentication")
    if section is None:
        return AuthenticationConfig()
    return _authentication_config(section, problems)


#: the options of amps-default-authentication-module and the only value amps-py
#: supports for each (what it always does), with why
_DEFAULT_MODULE_SWITCHES: Final = {
    "AllowSpoofing": (
        "the user name a client logs on with is always taken as its identity (for "
        "entitlement and client-name ownership)"
    ),
    "RequireLogon": "every connection must log on before anything else",
}


def _authentication_config(section: etree._Element, problems: _Problems) -> AuthenticationConfig:
    """An ``Authentication`` element (of AMPSConfig or of a Transport)."""
    module, path = _module_file(
        section,
        "PasswordFile",
        auth.PASSWORD_FILE_MODULE,
        "password file (amps-py users add FILE USER creates one)",
        auth.PasswordFile.load,
        problems,
    )
    options = _first(section, "Options")
    for option, behaviour in _DEFAULT_MODULE_SWITCHES.items():
        el = _first(options, option)
        value = _text(el, problems)
        if el is None or value is None or module is None:
            continue
        if module != auth.DEFAULT_AUTHENTICATION_MODULE:
            problems.add(
                el,
                f"Options/{option} is an option of {auth.DEFAULT_AUTHENTICATION_MODULE}, "
                f"not of {module}",
                f"remove <{option}>",
            )
        elif value in ("false", "disabled"):
            problems.add(
                el,
                f"{option} {value} is recognised by AMPS but not supported by amps-py yet: "
                f"with {auth.DEFAULT_AUTHENTICATION_MODULE}, {behaviour}",
                f"remove <{option}> (amps-py behaves as {option} true), or use "
                f"<Module>{auth.PASSWORD_FILE_MODULE}</Module> to check who logs on",
            )
    return AuthenticationConfig(module or auth.DEFAULT_AUTHENTICATION_MODULE, path)


def _build_entitlement(root: etree._Element, problems: _Problems) -> EntitlementConfig:
    section = _first(root, "Entitlement")
    if section is None:
        return EntitlementConfig()
    return _entitlement_config(section, problems)


def _entitlement_config(section: etree._Element, problems: _Problems) -> EntitlementConfig:
    """An ``Entitlement`` element (of AMPSConfig or of a Transport)."""
    module, path = _module_file(
        section,
        "RulesFile",
        auth.RULE_ENTITLEMENT_MODULE,
        "JSON rules file",
        auth.EntitlementRules.load,
        problems,
    )
    return EntitlementConfig(module or auth.DEFAULT_ENTITLEMENT_MODULE, path)


def _transport_access(
    transport: etree._Element, problems: _Problems
) -> tuple[AuthenticationConfig | None, EntitlementConfig | None] | None:
    """A Transport's own ``Authentication`` and ``Entitlement`` (``None`` where it has
    none: the instance's apply); None (and problems) when one is wrong."""
    auth_el = _first(transport, "Authentication")
    entitlement_el = _first(transport, "Entitlement")
    before = len(problems.items)
    authentication = _authentication_config(auth_el, problems) if auth_el is not None else None
    entitlement = (
        _entitlement_config(entitlement_el, problems) if entitlement_el is not None else None
    )
    return None if len(problems.items) > before else (authentication, entitlement)
