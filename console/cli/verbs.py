"""`courier message cancel|delete` and `courier purge`: the verbs users of other queues expect
(River's JobCancel, pgmq's delete and purge_queue), each one call of sqlkit.verbs."""

from __future__ import annotations

import getpass
import sys

import click

from sqlkit import verbs
from sqlkit.errors import InvalidInput

from .context import ROW_ID, common_options, console, emit, machine_output, open_connection


def _actor() -> str | None:
    """On whose behalf, for the event log: the operating-system user running the command."""
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no USER variable and no passwd entry (a bare container): the role alone
        return None


@click.group("message")
def message_group() -> None:
    """One message by id (or key): cancel it, or delete it."""


@message_group.command("cancel")
@click.argument("message_id", type=ROW_ID, required=False)
@click.option("--key", help="The message's idempotency key (or a pull topic's message key); needs --endpoint.")
@click.option("--endpoint", help="The endpoint or topic whose message holds --key.")
@common_options
def cancel(message_id: int | None, key: str | None, endpoint: str | None) -> None:
    """Cancel MESSAGE_ID, or the message of --endpoint holding --key.

    Pending, scheduled or retrying, it leaves the queue at once. In processing, its delivery
    may already be under way and cannot be called back, but its outcome is discarded (the
    worker's report counts as stale) and it is never retried or delivered again. Either way it
    ends in the archive as cancelled, and the event log says who cancelled it. Cancelling a
    cancelled message again changes nothing."""
    if (message_id is None) == (key is None):
        raise click.UsageError("give MESSAGE_ID, or --key KEY with --endpoint NAME (one of the two)")
    if key is not None and endpoint is None:
        raise click.UsageError("--key needs --endpoint NAME: keys are per endpoint")
    if message_id is not None and endpoint is not None:
        raise click.UsageError("--endpoint goes with --key; a MESSAGE_ID names its message alone")
    with open_connection() as conn:
        if message_id is not None:
            done = [verbs.cancel(conn, message_id, _actor())]
        else:
            done = verbs.cancel_by_key(conn, endpoint or "", key or "", _actor())

    def render() -> None:
        for row in done:
            if row.was == "cancelled":
                console.print(f"message {row.id} of {row.endpoint_name} was already cancelled", highlight=False)
            elif row.was == "processing":
                console.print(f"cancelled message {row.id} of {row.endpoint_name} while in processing: its "
                              "delivery may be under way, and its outcome will be discarded", highlight=False)
            else:
                console.print(f"cancelled message {row.id} of {row.endpoint_name} ({row.was})", highlight=False)

    emit(done if key is not None else done[0], render)


@message_group.command("delete")
@click.argument("message_id", type=ROW_ID)
@common_options
def delete(message_id: int) -> None:
    """Delete MESSAGE_ID outright, without a lease (pgmq's delete), in any state but processing.

    Nothing goes to the archive; the event log keeps who deleted it (message.deleted). A
    message in processing is refused: `courier message cancel` takes it from its worker."""
    with open_connection() as conn:
        was = verbs.delete(conn, message_id, _actor())
    emit({"id": message_id, "deleted": True, "was": was},
         lambda: console.print(f"deleted message {message_id} ({was})", highlight=False))


@click.command("purge")
@click.argument("endpoint")
@click.option("--dlq", is_flag=True, help="Purge the endpoint's DLQ (its failed entries) instead; so does "
                                          "naming it ENDPOINT.dlq.")
@click.option("--no-archive", "no_archive", is_flag=True,
              help="Drop the messages outright instead of archiving them as purged.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (for scripts; needed without a terminal).")
@common_options
def purge(endpoint: str, dlq: bool, no_archive: bool, yes: bool) -> None:
    """Remove every pending message of ENDPOINT (an endpoint or topic) in one call.

    Scheduled and retrying messages go too; messages in processing never do. They go to the
    archive as purged (--no-archive: gone for good). With --dlq, the endpoint's DLQ entries
    awaiting redrive are deleted instead (each dead-lettered message is in the archive as
    failed already). Asks first, naming how many, unless --yes."""
    dead_letters = dlq or endpoint.endswith(".dlq")
    if dead_letters and no_archive:
        named = "--dlq" if dlq else f"--dlq (which naming {endpoint} implies)"
        raise click.UsageError(f"--no-archive cannot be combined with {named}: a DLQ purge archives nothing, "
                               "as each dead-lettered message is in the archive as failed already")
    with open_connection() as conn:
        due = verbs.purge_count(conn, endpoint, dlq)
        what = (f"{due} DLQ entr{'y' if due == 1 else 'ies'} of {endpoint.removesuffix('.dlq')}" if dead_letters
                else f"{due} pending message{'' if due == 1 else 's'} of {endpoint}")
        if due and not yes:
            if machine_output() or not sys.stdin.isatty():
                raise InvalidInput(f"courier purge removes {what} and asks first, but there is no terminal to "
                                   "ask on", hint="add --yes to confirm")
            where = "for good" if dead_letters or no_archive else "to the archive as purged"
            click.confirm(f"Purge {what} ({where})?", abort=True)
        purged = verbs.purge(conn, endpoint, dlq=dlq, archive=not no_archive, actor=_actor())
    noun = ("DLQ entr" + ("y" if purged == 1 else "ies")) if dead_letters else f"message{'' if purged == 1 else 's'}"
    emit({"purged": purged, "endpoint": endpoint, "dlq": dead_letters, "archived": not (no_archive or dead_letters)},
         lambda: console.print(f"purged {purged} {noun} of {endpoint.removesuffix('.dlq')}", highlight=False))


COMMANDS = [message_group, purge]
