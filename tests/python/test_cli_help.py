"""Every command's --help in one layout: each option line is its flags (and their placeholders),
then at least two spaces, then its text, or the text alone on the lines below a flag too long for
the column. A flag never runs into its text (`--generation-validatextra round trips...` was printed
when a flag was longer than the column)."""

from __future__ import annotations

import re

import pytest


def commands(run_cli) -> list[str]:
    listing = run_cli("--help").stdout
    names = re.findall(r"^  ([a-z]+) {2,}\S", listing.split("commands:", 1)[1], flags=re.MULTILINE)
    assert len(names) >= 10, listing
    return names


# What may follow a flag in its column: a placeholder (N, SIZE, bf16|fp32, r) or another flag.
PLACEHOLDER = re.compile(r"[A-Z0-9][A-Za-z0-9_.,:|=-]*|[a-z]|[a-z0-9]+(\|[a-z0-9]+)+|\[.*\]|\.\.\.")


def misprinted(help_text: str) -> list[str]:
    """The option lines whose flag column runs into their text."""
    bad = []
    for line in help_text.splitlines():
        if not re.match(r"^ {2,}-", line):
            continue
        parts = re.split(r" {2,}", line.strip(), maxsplit=1)
        gap = len(parts) == 2
        tokens = parts[0].split(" ")
        if not tokens[0].startswith("-"):
            bad.append(line)
            continue
        # With a gap the column is flags and what they take (a literal value like `memcpy` too);
        # without one every word must be a flag or a placeholder: a word of text means a run-in.
        if not gap and not all(t.startswith("-") or PLACEHOLDER.fullmatch(t) for t in tokens[1:]):
            bad.append(line)
    return bad


def test_the_layout_check_catches_a_flag_run_into_its_text():
    assert misprinted("  --generation-validatextra round trips after a bad file (default 2)\n")
    assert misprinted("  --request-timeout S seconds per attempt\n")
    assert not misprinted("  --request-timeout S\n                      seconds per attempt\n")
    assert not misprinted("  --world-size R --rank r   plan as rank r of R\n  --baseline memcpy  a copy\n")


def test_every_commands_help_has_one_layout(run_cli):
    bad = {}
    for name in commands(run_cli):
        proc = run_cli(name, "--help", check=False)
        assert proc.returncode == 0, (name, proc.stderr)
        text = proc.stdout + proc.stderr
        assert "usage: draftfeed " + name in text, (name, text[:200])
        if lines := misprinted(text):
            bad[name] = lines
    assert not bad, "\n".join(f"draftfeed {n} --help: {line}" for n, ls in bad.items() for line in ls)


@pytest.mark.parametrize("name", ["bench", "generate"])
def test_long_online_flags_keep_their_whole_name(run_cli, name):
    text = run_cli(name, "--help").stdout
    for flag in ("--generation-validation-retries N", "--max-consecutive-failures N"):
        assert f"  {flag}\n" in text or f"  {flag}  " in text, (flag, text)


def documented_flags(help_text: str) -> list[str]:
    """The flags the option lines of a help text name (its first column)."""
    flags = []
    for line in help_text.splitlines():
        if re.match(r"^ {2}--[a-z]", line):
            flags.append(line.split()[0])
    return flags


def test_every_documented_flag_is_one_the_command_takes_and_each_once(run_cli):
    """Each command's help is made from the table its parser takes (src/cli/flag_table.h): a flag
    the help names is never refused as unknown, and no flag is named twice."""
    for name in commands(run_cli):
        text = run_cli(name, "--help").stdout
        flags = documented_flags(text)
        assert flags, (name, text[:300])
        # The synopsis names no flag the options do not describe (verify's named --hidden-states
        # and --examples, described nowhere).
        synopsis = text.split("\n\n", 1)[0]
        assert set(re.findall(r"--[a-z][a-z0-9-]*", synopsis)) <= set(flags), (name, synopsis)
        assert len(flags) == len(set(flags)), (name, sorted(f for f in flags if flags.count(f) > 1))
        for flag in flags:
            # Parsed before anything runs: a flag the command does not take is refused by name; one
            # it takes lets the parser go on to the next word, which is no flag of any command.
            proc = run_cli(name, flag + "=1", "--zz-no-such-flag", check=False)
            out = proc.stdout + proc.stderr
            assert proc.returncode == 2, (name, flag, out[-300:])
            assert f"unknown option {flag} " not in out, (name, flag, out[-300:])
            assert "takes no value" in out or "unknown option --zz-no-such-flag" in out, (
                name, flag, out[-300:])
