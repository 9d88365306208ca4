"""The doctor's verdicts: each check is a pure function of facts gathered elsewhere.

Each gives one :class:`Check`: ``ok``, ``warn`` (something is off but DMs flow)
or ``block`` (DMs cannot flow until it is fixed), with the fix for anything not
ok. :func:`hermes_actors.ops.doctor.run_doctor` gathers the facts and calls them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes_actors.core.config import parse_config, unknown_keys
from hermes_actors.core.shell import shell_command
from hermes_actors.hermes.install import CLI_PROFILE_RE, INSTALL_HERMES, NO_HERMES_CLI, profile_home
from hermes_actors.hermes.setup import PLUGIN_NAME
from hermes_actors.hermes.warm_or_cli import API_SERVER_START_SECONDS
from hermes_actors.messages import ProfileInfo
from hermes_actors.store.journal_screen import REFUSE, SET_ASIDE, JournalEntry, described, fix_for
from hermes_actors.transports.peer_cli import PEER_FIX, no_peer_command
from hermes_actors.transports.redis.store import certificate_fix

__all__ = [
    "BLOCK",
    "OK",
    "WARN",
    "Check",
    "blocking",
    "check_cli",
    "check_config_keys",
    "check_connection_ids",
    "check_daemon",
    "check_journal",
    "check_managed",
    "check_models",
    "check_peers",
    "check_plugin",
    "check_profile_folders",
    "check_redis",
    "check_redis_extra",
    "check_relay_dirs",
    "check_warm_turns",
    "for_the_hosts_runner",
    "within_sentence",
]

OK, WARN, BLOCK = "ok", "warn", "block"


@dataclass(frozen=True)
class Check:
    """One verdict: what was checked, how it stands, what was found, and the fix (when not ok)."""

    name: str
    level: str  # ok | warn | block
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "level": self.level, "detail": self.detail, "fix": self.fix}


def blocking(checks: list[Check]) -> bool:
    """Pure: whether anything blocks DMs."""
    return any(c.level == BLOCK for c in checks)


def _enable(root: Path, *options: str) -> str:
    """Pure: the ``hermes-actors enable`` command a fix names, quoted to run as printed (``core.shell``)."""
    return shell_command("hermes-actors", "enable", "--root", root, *options)


def _gateway_run(root: Path, *options: str) -> str:
    """Pure: the ``hermes gateway run`` command on ``root`` a fix names, quoted to run as printed."""
    return shell_command("hermes", "gateway", "run", *options, env={"HERMES_HOME": root})


def check_cli(cli: str | None, version: str | None, error: str | None) -> Check:
    """Pure: the hermes CLI and its version."""
    if cli is None:
        return Check("hermes CLI", BLOCK, f"{NO_HERMES_CLI}: every turn fails runtime_offline",
                     f"{INSTALL_HERMES} or pass --cli PATH")
    if error is not None:
        return Check("hermes CLI", BLOCK, f"{cli} does not run: {error}",
                     "reinstall hermes-agent, or point --cli at a working hermes")
    return Check("hermes CLI", OK, f"{cli} ({version or 'version unknown'})")


def check_managed(root: Path, profiles: list[ProfileInfo]) -> Check:
    """Pure: the install is Bot-Mode-managed, and which profiles are not."""
    unmanaged = [p.profile for p in profiles if not p.managed]
    if len(unmanaged) == len(profiles):
        return Check("profiles managed", BLOCK, "no profile is Bot-Mode-managed: message_agent refuses every DM",
                     _enable(root))
    unrunnable = [p.profile for p in profiles if p.managed and not CLI_PROFILE_RE.match(p.profile)]
    if unrunnable:  # on the roster, so DMs to them are acked, and every turn then fails
        return Check("profiles managed", WARN, f"managed, but hermes cannot run their turns: {', '.join(unrunnable)} "
                     "(hermes profile names are lowercase letters, digits, '_' and '-')",
                     f"rename those folders under {root / 'profiles'}, or: "
                     + shell_command("hermes-actors", "disable", "--root", root, "--profiles", ",".join(unrunnable)))
    skipped = [p for p in unmanaged if not CLI_PROFILE_RE.match(p)]  # a host on the real Hermes leaves them off
    unmanaged = [p for p in unmanaged if CLI_PROFILE_RE.match(p)]
    if unmanaged:
        return Check("profiles managed", WARN, f"not managed: {', '.join(unmanaged)} (their Bot Chat gets no "
                     "message_agent tool; they still receive DMs)",
                     _enable(root, "--profiles", ",".join(unmanaged)))
    managed = [p.profile for p in profiles if p.managed]
    left_off = f"; left off the roster, hermes cannot run them: {', '.join(skipped)}" if skipped else ""
    return Check("profiles managed", OK, f"{len(managed)} profile(s): {', '.join(managed)}{left_off}")


def check_profile_folders(root: Path, problems: list[str]) -> Check:
    """Pure: every folder under ``<root>/profiles`` is seen (``problems`` from
    :func:`~hermes_actors.store.hermes_root.scan_profile_dirs`).

    A ``profiles/`` that is a symlink or a file hides every profile but the default one (DMs to
    them: "Unknown sender/target"), a folder whose name is no profile name is none (DMs to it:
    "Invalid target"), and one another user owns or may write is no bot of this root
    (:func:`~hermes_actors.store.hermes_root.untrusted_profile`); the gateway only warns once in its log, so say
    it here.
    """
    if problems:
        return Check("profile folders", WARN, "; ".join(problems),
                     f"make {root / 'profiles'} and each profile in it a real folder of this user inside the root "
                     "(not a symlink, not a file, that other users may not write) with a profile name (rename a "
                     "folder the warning names; remove one that is not this user's), then restart the host")
    return Check("profile folders", OK, f"no symlinked, unreadable, unreachable or other user's profile folder "
                 f"under {root}")


def _cannot_tell(root: Path, names: list[str], problems: Mapping[str, str]) -> tuple[str, str]:
    """Pure: what the checks that read the profiles' ``config.yaml`` say of those that do not read, and the fix.

    One message for one reading rule: each file's problem as
    :func:`~hermes_actors.store.yaml_file.read_yaml_mapping` words it (what ``config keys`` says of the root's own:
    ``… is not a regular file``, ``… is malformed YAML (…)``), never a guess at why.

    Args:
        root: the Hermes root.
        names: the profiles whose ``config.yaml`` does not read.
        problems: each one's problem (a profile missing here: "cannot be read").

    Returns:
        ``(detail, fix)``: ``cannot tell: <problems>``, and ``fix <files>``.
    """
    files = [profile_home(root, name) / "config.yaml" for name in names]
    said = [problems.get(name) or f"config file {path} cannot be read" for name, path in zip(names, files, strict=True)]
    return f"cannot tell: {'; '.join(said)}", f"fix {', '.join(str(path) for path in files)}"


def check_plugin(root: Path, enabled: dict[str, bool | None], problems: Mapping[str, str] | None = None) -> Check:
    """Pure: the hermes-actors plugin is listed in ``plugins.enabled`` of each managed profile.

    ``enabled`` maps each managed profile to whether it lists the plugin, or None when its
    ``config.yaml`` cannot be read (then enabling would not help: the file needs fixing first);
    ``problems`` says why such a file does not read (:func:`_cannot_tell`).
    """
    if not enabled:  # "enabled for 0 managed profile(s)" read as a pass on a root never enabled
        return Check("plugin enabled", BLOCK, "no profile is Bot-Mode-managed, so none lists the plugin: "
                     "no bot has the message_agent tool", _enable(root))
    unreadable = [name for name, on in enabled.items() if on is None]
    if unreadable:
        detail, fix = _cannot_tell(root, unreadable, problems or {})
        return Check("plugin enabled", BLOCK, f"{detail} (hermes cannot load the plugin from it either)", fix)
    missing = [name for name, on in enabled.items() if not on]
    if enabled and len(missing) == len(enabled):
        return Check("plugin enabled", BLOCK, f"'{PLUGIN_NAME}' is in no profile's plugins.enabled: "
                     "the bots have no message_agent tool", _enable(root))
    if missing:
        return Check("plugin enabled", WARN, f"not enabled for: {', '.join(missing)} (those bots cannot send DMs)",
                     _enable(root, "--profiles", ",".join(missing)))
    return Check("plugin enabled", OK, f"enabled for {len(enabled)} managed profile(s)")


def check_models(root: Path, models: dict[str, str | None], problems: Mapping[str, str] | None = None) -> Check:
    """Pure: each profile that receives DMs names a model in its own ``config.yaml``.

    ``models`` maps each such profile (managed or not: both are on the roster) to its model name
    (``""`` when nothing names one: :func:`~hermes_actors.hermes.install.names_no_model`), or None
    when its ``config.yaml`` cannot be read (hermes cannot read it either); ``problems`` says why
    (:func:`_cannot_tell`).
    A profile is its own hermes home: the root's model is not its model. Without one,
    hermes runs a turn only if the profile's environment names a provider; otherwise every
    DM to that bot fails ``missing_config`` after it was acked.
    """
    unreadable = [name for name, model in models.items() if model is None]
    if unreadable:  # a managed one's is named by the plugin check too; an unmanaged one's only here
        detail, fix = _cannot_tell(root, unreadable, problems or {})
        return Check("models", WARN, f"{detail} (hermes cannot run their turns either)", fix)
    missing = [name for name, model in models.items() if model == ""]
    if missing:
        files = ", ".join(str(profile_home(root, name) / "config.yaml") for name in missing)
        return Check("models", WARN, f"no model set for: {', '.join(missing)} (their turns fail missing_config "
                     "unless hermes finds a provider in their environment)",
                     f"set model.default (and its provider) in {files}, e.g. with: "
                     + shell_command("hermes", "-p", missing[0], "model"))
    named = sorted({model for model in models.values() if model})
    return Check("models", OK, f"every profile that receives DMs names a model ({', '.join(named) or 'none'})")


def check_daemon(root: Path, pong: dict[str, Any] | None, *, gateway_hosts: bool = False) -> Check:
    """Pure: a host (``serve`` or the hermes gateway with the plugin) answers on the submit endpoint.

    ``gateway_hosts``: the root's ``config.yaml`` already asks its hermes gateway to host the actors
    (:func:`~hermes_actors.hermes.setup.gateway_hosts_actors`): the fix then names no ``enable --gateway`` to run
    first.
    """
    if pong is None:
        after = "" if gateway_hosts else f", after {_enable(root, '--gateway')}"
        return Check("daemon running", BLOCK, "no process hosts the actors of this root: the bots' DMs are refused "
                     "runtime_offline", f"{shell_command('hermes-actors', 'serve', '--root', root)}   (or: "
                     f"{_gateway_run(root)}{after})")
    return Check("daemon running", OK, f"pid {pong.get('pid')} serves {pong.get('root')} "
                 f"(hermes-actors {pong.get('version')})")


def check_warm_turns(root: Path, server: str | None, answers: bool, key_missing: bool, why: str = "",
                     misconfigured: bool = False, none_because: str = "", runs_unseen: bool = False,
                     host: Mapping[str, Any] | None = None) -> Check:
    """Pure: whether turns run warm through the hermes gateway's API server, and why not.

    Args:
        root: the Hermes root.
        server: the API server the root's config names (None: none usable).
        answers: it answered a probe just now.
        key_missing: the config enables the API server but no ``API_SERVER_KEY`` of 16+ characters is set.
        why: what the probe saw when it did not answer as expected.
        misconfigured: something answered, but not as our config expects (a refused key, another server).
        none_because: why the hermes gateway starts no API server though something asks for one
            (:attr:`~hermes_actors.hermes.gateway_api.GatewayApiServer.why`; ``""``: nothing does).
        runs_unseen: ``key_missing`` says hermes starts none from the settings we read, yet the API server
            ``server`` of the root's running hermes gateway answers its ``/health`` (``answers``): the gateway took
            its ``API_SERVER_KEY`` from the environment ``hermes gateway run`` was started with, which we cannot see.
        host: the running host's ``ping`` answer (None: no host runs): its ``turns_via`` and ``cli_seconds``
            say how its next turn runs (:func:`hermes_actors.hermes.warm_or_cli.turns_info`).

    Returns:
        The check: ``ok`` only when the server answers and the running host (if any) runs its next turn there,
        or, for a host that does not say how its turns run, with a line that says only the probe was made.
    """
    if runs_unseen and key_missing and server is not None and answers:
        return _answering_unseen(root, server, host)
    if key_missing:
        return Check("warm turns", WARN, "the hermes API server is enabled but API_SERVER_KEY is not set or shorter "
                     "than 16 characters (or is a placeholder such as changeme): hermes refuses to start it, so "
                     "every turn runs with the hermes CLI (2–4 s of CPU each)",
                     f"set API_SERVER_KEY in {root / '.env'}, then restart: {_gateway_run(root)}")
    if server is None and none_because:
        return Check("warm turns", WARN, f"the hermes gateway starts no API server: {none_because}; so every turn "
                     "runs with the hermes CLI (2–4 s of CPU each)",
                     f"set the API server's variables in {root / '.env'}, or enable it in config.yaml "
                     f"({_enable(root, '--gateway')}; a top-level api_server: block must not say enabled: false), "
                     f"then restart the gateway: {_gateway_run(root, '--replace')}")
    if server is None:
        return Check("warm turns", OK, "not configured: turns run with the hermes CLI (for warm turns: "
                     f"{_enable(root, '--gateway')})")
    if not answers and misconfigured and "API_SERVER_KEY" in why:
        return Check("warm turns", WARN, f"the hermes API server {server} {why}: turns run with the hermes CLI",
                     f"give hermes-actors and the gateway the same API_SERVER_KEY ({root / '.env'}), then restart the "
                     f"gateway: {_gateway_run(root, '--replace')}")
    if not answers and misconfigured:
        return Check("warm turns", WARN, f"the hermes API server {server} {why}: turns run with the hermes CLI",
                     f"free the port, or move the API server to another one: {_enable(root, '--gateway')} --port N, "
                     "then restart the gateway")
    via = host.get("turns_via") if host is not None else None
    pid = host.get("pid") if host is not None else None
    if not answers and via == "starting":
        return Check("warm turns", WARN, f"the hermes API server {server} does not answer yet: the running host "
                     f"(pid {pid}, the hermes gateway) waits for it to start, up to {API_SERVER_START_SECONDS:g} s "
                     "from its own start, then runs turns with the hermes CLI until it answers",
                     f"if it stays so, hermes says why in {root / 'logs' / 'gateway.log'}")
    if not answers:
        return Check("warm turns", WARN, f"the hermes API server {server} does not answer: turns run with the "
                     "hermes CLI until it does", _gateway_run(root))
    return _answering(root, server, host)


def _answering(root: Path, server: str, host: Mapping[str, Any] | None) -> Check:
    """Pure: the warm turns check when the API server answered the probe: what the running host does with it."""
    if host is None:
        return Check("warm turns", OK, f"the hermes API server {server} answers (a probe just now; no host runs: one "
                     "that starts runs its turns warm through it)")
    pid, via, seconds = host.get("pid"), host.get("turns_via"), host.get("cli_seconds")
    if via in ("warm", "starting"):
        return Check("warm turns", OK, f"through the hermes API server {server} (the running host, pid {pid}, runs "
                     "its next turn there)")
    if via == "cli" and isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
        return Check("warm turns", WARN, f"the hermes API server {server} answers, but the running host (pid {pid}) "
                     f"runs turns with the hermes CLI for up to {seconds:.0f} s more, then tries the API server again "
                     "(it did not answer earlier)",
                     "nothing to do: its turns run warm after that (restarting the host switches at once)")
    if via == "cli":
        return Check("warm turns", WARN, f"the hermes API server {server} answers, but the running host (pid {pid}) "
                     "runs every turn with the hermes CLI: it chose how its turns run when it started, before the "
                     "root's config named the API server",
                     f"restart the host ({shell_command('hermes-actors', 'serve', '--root', root)}, or "
                     f"{_gateway_run(root, '--replace')} when the gateway hosts the actors)")
    return Check("warm turns", OK, f"the hermes API server {server} answers (a probe just now; the running host, "
                 f"pid {pid}, does not say how its turns run)")


def _answering_unseen(root: Path, server: str, host: Mapping[str, Any] | None) -> Check:
    """Pure: the warm turns check when the API server answers though the key we read is missing: it runs, with
    the key of the environment the gateway was started with, which ``doctor`` cannot see."""
    unseen = (f"its API_SERVER_KEY is in neither {root / '.env'} nor doctor's environment: the hermes gateway took "
              "it from the environment it was started with, which doctor cannot see")
    if host is None:
        return Check("warm turns", OK, f"the hermes API server {server} answers (a probe of /health just now; "
                     f"{unseen}; no host runs: one that has that key, such as the hermes gateway hosting the actors, "
                     "runs its turns warm through it)")
    if host.get("turns_via") == "cli" and host.get("cli_seconds") is None:
        return Check("warm turns", WARN, f"the hermes API server {server} answers ({unseen}), but the running host "
                     f"(pid {host.get('pid')}) runs every turn with the hermes CLI: it read no usable API_SERVER_KEY "
                     "(or no API server in the root's config) when it started",
                     f"set the gateway's API_SERVER_KEY in {root / '.env'} too, then restart the host "
                     f"({shell_command('hermes-actors', 'serve', '--root', root)}, or "
                     f"{_gateway_run(root, '--replace')} when the gateway hosts the actors)")
    check = _answering(root, server, host)
    return Check(check.name, check.level, f"{check.detail}; {unseen}", check.fix)


def check_config_keys(path: Path, raw: dict[str, Any], problem: str | None) -> Check:
    """Pure: config.yaml reads, and has no unknown ``bot_mode`` key (with the closest known one)."""
    if problem:
        return Check("config keys", WARN, problem, f"fix {path} (the defaults are used meanwhile)")
    unknown = unknown_keys(raw)
    _config, bad = parse_config(raw, lambda _key: str(path))  # the bad values a host warns of, defaults used
    if unknown or bad:
        parts = [f"unknown {key} (did you mean {hint}?)" if hint else f"unknown {key}" for key, hint in unknown]
        fixes = [f"rename {key} to {hint}" if hint else f"remove {key}" for key, hint in unknown]
        fixes += ["fix the values above (what each warning says is used meanwhile)"] if bad else []
        return Check("config keys", WARN, "; ".join(bad + parts), f"in {path}: " + "; ".join(fixes))
    return Check("config keys", OK, f"{path.name}: no unknown bot_mode key, no bad value")


def check_redis_extra(wanted: bool, installed: bool) -> Check:
    """Pure: the ``[redis]`` extra is installed when the Redis transport is configured."""
    if not wanted:
        return Check("redis extra", OK, "not needed (file transport)" + ("" if not installed else "; installed"))
    if not installed:
        return Check("redis extra", BLOCK, "bot_mode.transport selects Redis but the redis package is missing",
                     "pip install 'hermes-actors[redis]'")
    return Check("redis extra", OK, "installed")


def check_redis(url_text: str | None, error: str | None) -> Check:
    """Pure: the configured Redis answers PING with our credentials."""
    if url_text is None:
        return Check("redis", OK, "not configured (file transport)")
    if error is None:
        return Check("redis", OK, f"{url_text} answers")
    if "auth" in error.lower() or "password" in error.lower() or "noperm" in error.lower():
        return Check("redis", BLOCK, f"{url_text} refused our credentials: {error}",
                     "put the right user:password in bot_mode.transport (or REDIS_URL)")
    if "CERTIFICATE_VERIFY_FAILED" in error:
        return Check("redis", BLOCK, f"{url_text}: its TLS certificate did not verify: {error}",
                     certificate_fix(url_text))
    return Check("redis", BLOCK, f"{url_text} is unreachable: {error}",
                 "start Redis or fix the host/port in bot_mode.transport (or REDIS_URL)")


def check_connection_ids(own: set[str], remote: set[str], routed_as: set[str], *, on: str = "file") -> Check:
    """Pure: the names the relay hub uses for this root match the gateway's ``--connection-id``.

    Args:
        own: the connection ids this root's running gateways announce (file: their heartbeats; Redis: the
            ``alive:<connection>`` lease of the root's connection id).
        remote: the connection ids the roster lists (the other roots).
        routed_as: the ``target_connection`` of envelopes the hub handed to this root (file relay only).
        on: the transport the roster was read from (``file`` or ``redis``:
            :func:`~hermes_actors.ops.remote_roster.read_remote_roster`).
    """
    if own & remote:
        clash = ", ".join(sorted(own & remote))
        return Check("connection ids", BLOCK, f"this root's gateway runs as {clash}, a name the hub gives ANOTHER "
                     "root", "give every root a unique connection id: serve --connection-id X and relay --name X")
    foreign = routed_as - own
    if own and foreign:
        return Check("connection ids", BLOCK, f"the hub routes to this root as {', '.join(sorted(foreign))} but its "
                     f"gateway runs as {', '.join(sorted(own))}",
                     "use the same name in serve --connection-id and the hub's --name for this root")
    others = f"; the other connections on Redis: {', '.join(sorted(remote)) or 'none'}" if on == "redis" else ""
    if not own:
        return Check("connection ids", OK, "no running gateway announces a connection id "
                     + ("on Redis " if on == "redis" else "") + f"(nothing to compare){others}")
    where = " on Redis" if on == "redis" else ""
    return Check("connection ids", OK, f"gateway runs as {', '.join(sorted(own))}{where}"
                 + (f"; the hub routes here as {', '.join(sorted(routed_as))}" if routed_as else "") + others)


def within_sentence(text: str) -> str:
    """Pure: a sentence as it reads joined into another one (``…, but the hermes CLI at …``): its first letter
    lower-cased, unless its first word is all capitals (``CLI``, ``EACCES``: a name, not a capital).

    Args:
        text: a sentence, e.g. ``The hermes CLI at '/usr/bin/hermes' has no `peer` command``.

    Returns:
        ``text`` with its first letter lower-cased, or as it is when its first word is an acronym or it is blank.
    """
    first = text.split(maxsplit=1)[0] if text.strip() else ""
    if len(first) > 1 and first.isupper():
        return text
    return text[:1].lower() + text[1:]


def check_peers(via_cli: list[str], on_redis: list[str], cli: str | None, missing: bool | None) -> Check:
    """Pure: the ``bot_peers`` entries reached with ``hermes peer dm`` have a hermes that has that command.

    A DM to such a peer is acked, then fails ``runtime_offline`` seconds later when the CLI has no ``peer``
    command (hermes-agent 0.19): say it here, before a bot finds out.

    Args:
        via_cli: the peers the CLI transport carries (on Redis: those that are no connection on it).
        on_redis: the peers that are connections on this root's Redis (carried by the Redis transport).
        cli: the hermes executable (None: none found; the hermes CLI check blocks then).
        missing: :func:`~hermes_actors.transports.peer_cli.peer_command_missing` of ``cli`` (None: unknown).
    """
    redis = f"; on Redis: {', '.join(on_redis)}" if on_redis else ""
    if not via_cli:
        return Check("bot_peers", OK, (f"every peer is a connection on Redis: {', '.join(on_redis)}" if on_redis
                                       else "none configured"))
    names = ", ".join(via_cli)
    if cli is not None and missing:
        why = within_sentence(no_peer_command(cli))  # a sentence of its own where a failed DM says it
        return Check("bot_peers", WARN, f"{names}: reached with `hermes peer dm`, but {why}: "
                     "a DM to them is acked, then fails runtime_offline, NOT delivered" + redis,
                     PEER_FIX.rstrip(".") + " (a peer on this root's Redis is reached by its connection id), or "
                     "remove them from bot_peers")
    how = "" if missing is False else " (could not tell whether the hermes CLI has the `peer` command)"
    return Check("bot_peers", OK, f"{names}: reached with `hermes peer dm`{how}{redis}")


def check_relay_dirs(loose: dict[Path, int], refusal: str | None = None) -> Check:
    """Pure: a start may use the relay directories, and no other user may write in them (they are 0700:
    docs/reliability.md).

    Args:
        loose: each relay directory of ours that its group or other users may write in, and its mode.
        refusal: why a durable start would refuse the root as it is (``bot_relay/`` or ``journal/`` swapped for a
            symlink or a file, another user's directory: the start's own text, naming it and saying what to do),
            None when it would not.
    """
    if refusal is not None:
        return Check("relay directories", BLOCK, refusal,
                     "put that directory right as said above: until then `hermes-actors serve` (and a durable "
                     "Gateway) refuses to start on this root, exit 2, changing nothing")
    if not loose:
        return Check("relay directories", OK, "no other user may write in them")
    found = ", ".join(f"{directory} (mode {mode:04o})" for directory, mode in sorted(loose.items()))
    return Check("relay directories", WARN, f"writable by other users: {found}; they could plant, replace or remove "
                 "relay files there (an envelope replaced is refused, and its DM is NOT delivered)",
                 f"{shell_command('chmod', '700', *sorted(loose))} (a running gateway sets them back at its next "
                 "rescan, and at its start)")


def check_journal(entries: list[JournalEntry], quarantined: list[JournalEntry], me: int) -> Check:
    """Pure: the journal files, judged as a durable start judges them
    (:func:`~hermes_actors.store.journal_screen.journal_verdict`).

    Blocks on what the start refuses (a symlink, another user's file, one of ours we may not read: it may hold
    acked DMs, and ``serve`` exits 2 until it is put right); warns on what it moves into quarantine (a FIFO, a
    directory: it holds no records), on what a start moved there (the DMs journaled in a file it took the place
    of could not be re-offered), and on a journal file a start moved there (adopted with unreadable lines, or
    moved in a race): the DMs journaled in it that no other journal holds are not re-offered while it is there.

    Args:
        entries: the ``j-*.log`` entries of ``bot_relay/journal`` (:func:`~hermes_actors.store.journal_screen.
            journal_files_found`).
        quarantined: those a start moved into ``bot_relay/quarantine``.
        me: this user's uid (the owner a journal file must have).
    """
    refused = [entry for entry in entries if entry.verdict == REFUSE]
    if refused:
        return Check("journal", BLOCK, "; ".join(described(entry) for entry in refused) + ": it may hold acked DMs, "
                     "and a durable start (serve, Gateway) refuses the root until it is put right (its DMs never run "
                     "meanwhile)", "; ".join(fix_for(entry, me) for entry in refused))
    aside = [entry for entry in entries if entry.verdict == SET_ASIDE]
    if not aside and not quarantined:
        return Check("journal", OK, f"{len(entries)} journal file(s), each a regular file of this user")
    files = [entry for entry in quarantined if entry.ours]
    others = [entry for entry in quarantined if not entry.ours]
    found = [f"{described(entry)} (the next start moves it into quarantine)" for entry in aside]
    found += [f"{entry.path} ({entry.kind}) was moved into quarantine by a start, in place of a journal file"
              for entry in others]
    found += [f"{entry.path} is a journal file a start moved into quarantine (adopted with unreadable lines, or "
              "moved in a race): DMs journaled in it that no journal in journal/ holds are not re-offered"
              for entry in files]
    fixes = ["none for the start: it moves such an entry aside, never opened"] if aside else []
    if others:
        fixes.append("look at what became of the journal file it replaced, then remove it: "
                     + shell_command("rm", "-r", *(entry.path for entry in others)))
    if files:
        fixes.append("look in it for the DMs it holds (their 'accepted' lines) and resend those that never got an "
                     "outcome, then remove it: " + shell_command("rm", *(entry.path for entry in files)))
    said = "; DMs journaled in a file such an entry took the place of cannot be re-offered" if aside or others else ""
    return Check("journal", WARN, "; ".join(found) + said, "; ".join(fixes))


def for_the_hosts_runner(checks: list[Check], pong: dict[str, Any] | None) -> list[Check]:
    """Pure: a running host whose turns do not run hermes (``serve --runner demo``, an embedder's
    runner) needs no hermes CLI, no plugin and no model: those checks pass, saying why."""
    if pong is None or pong.get("runs_hermes") is not False:
        return checks
    why = (f"not needed by the running host (pid {pong.get('pid')}): its turns do not run hermes "
           "(a custom or demo runner)")
    return [Check(c.name, OK, why) if c.name in ("hermes CLI", "plugin enabled", "models") and c.level != OK else c
            for c in checks]
