"""Who may log on and what they may do: ``Authentication`` and ``Entitlement`` (of the
instance and of the replication transport), and the ``Authenticator`` a replication
destination logs on with."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path

from lxml import etree

from amps_py import auth
from amps_py.config.credentials import (
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


def _link_authenticator(el: etree._Element, problems: _Problems) -> LinkAuthenticator | None:
    """The ``Destination/Transport/Authenticator``; None (and problems) when wrong.

    Never puts a password in a problem: messages name the elements only.
    """
    module = _text(_first(el, "Module"), problems)
    options = _first(el, "Options")
    given = {
        tag: option
        for tag in ("Username", "Password", "PasswordFile", "PasswordEnv")
        if (option := _first(options, tag)) is not None
    }
    if module is None or problems.faulty(el):
        return None
    if module == DEFAULT_LINK_AUTHENTICATOR:
        return _default_authenticator(given, problems)
    ok, username = _link_username(el, options, given.get("Username"), problems)
    sources = [given[t] for t in ("Password", "PasswordFile", "PasswordEnv") if t in given]
    if not sources:
        problems.add(
            options if options is not None else el,
            f"the {PASSWORD_LINK_AUTHENTICATOR} module needs a password: one of "
            "Options/Password, Options/PasswordFile or Options/PasswordEnv",
            f"add one, e.g. {_AUTHENTICATOR_EXAMPLE}",
        )
        return None
    for extra in sources[1:]:
        problems.add(
            extra,
            f"<{extra.tag}> is given as well as <{sources[0].tag}> (line {_line(sources[0])}); "
            "an Authenticator takes exactly one password source",
            f"keep one of <Password>, <PasswordFile> and <PasswordEnv> and remove <{extra.tag}>",
        )
        ok = False
    source = sources[0]
    value = _text(source, problems)
    if value is None or not ok or username is None:
        return None
    return _password_authenticator(source, username, value, problems)


def _default_authenticator(
    given: Mapping[str, etree._Element], problems: _Problems
) -> LinkAuthenticator | None:
    """The default module, which sends no credentials: none may be ``given``."""
    for tag, option in given.items():
        problems.add(
            option,
            f"<{tag}> is only used by the {PASSWORD_LINK_AUTHENTICATOR} module; "
            f"{DEFAULT_LINK_AUTHENTICATOR} sends no credentials",
            f"remove <{tag}>, or set <Module>{PASSWORD_LINK_AUTHENTICATOR}</Module> "
            "to log on with a user and password",
        )
    return None if given else LinkAuthenticator(DEFAULT_LINK_AUTHENTICATOR)


def _link_username(
    el: etree._Element,
    options: etree._Element | None,
    user_el: etree._Element | None,
    problems: _Problems,
) -> tuple[bool, str | None]:
    """(ok, Username) of the password module: it must be given and be a user name."""
    username = _text(user_el, problems)
    if user_el is None:
        problems.add(
            options if options is not None else el,
            f"the {PASSWORD_LINK_AUTHENTICATOR} module needs Options/Username",
            f"add the user the link logs on as, e.g. {_AUTHENTICATOR_EXAMPLE}",
        )
        return False, username
    if username is not None and not _LINK_USER.fullmatch(username):
        problems.add(
            user_el,
            f"Username {username!r} contains whitespace or ':', which no user name can",
            "give the user name as written in the remote instance's password file",
        )
        return False, username
    return True, username


def _password_authenticator(
    source: etree._Element, username: str, value: str, problems: _Problems
) -> LinkAuthenticator | None:
    """The password module with its one password ``source`` (Password, PasswordEnv or
    PasswordFile, whose text is ``value``); a PasswordFile is read now to check it."""
    if source.tag == "Password":
        return LinkAuthenticator(PASSWORD_LINK_AUTHENTICATOR, username, password=value)
    if source.tag == "PasswordEnv":
        if not _ENV_NAME.fullmatch(value):
            problems.add(
                source,
                # the value is not echoed: it may well be the password itself
                "PasswordEnv is not an environment variable name",
                "give the variable's name (letters, digits and _, not starting with a "
                "digit), e.g. REPL_PW, not its value or ${...}",
            )
            return None
        return LinkAuthenticator(PASSWORD_LINK_AUTHENTICATOR, username, password_env=value)
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
    return LinkAuthenticator(PASSWORD_LINK_AUTHENTICATOR, username, password_file=path)


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


def _authentication_config(section: etree._Element, problems: _Problems) -> AuthenticationConfig:
    """An ``Authentication`` element (of AMPSConfig or of the replication Transport)."""
    module, path = _module_file(
        section,
        "PasswordFile",
        auth.PASSWORD_FILE_MODULE,
        "password file (amps-py users add FILE USER creates one)",
        auth.PasswordFile.load,
        problems,
    )
    return AuthenticationConfig(module or auth.DEFAULT_AUTHENTICATION_MODULE, path)


def _build_entitlement(root: etree._Element, problems: _Problems) -> EntitlementConfig:
    section = _first(root, "Entitlement")
    if section is None:
        return EntitlementConfig()
    module, path = _module_file(
        section,
        "RulesFile",
        auth.RULE_ENTITLEMENT_MODULE,
        "JSON rules file",
        auth.EntitlementRules.load,
        problems,
    )
    return EntitlementConfig(module or auth.DEFAULT_ENTITLEMENT_MODULE, path)
