"""Redis dedupe store: one key per event id, shared by every worker that talks to the same Redis.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_receiver.dedupe.redis``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import itertools
import logging
import os
import secrets
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio.to_thread

try:
    import redis
    import redis.asyncio
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "usp_receiver.dedupe.redis needs the redis package: install usp-receiver[redis]"
    ) from exc

from usp_receiver.dedupe import _resp
from usp_receiver.dedupe._protocol import DEFAULT_LEASE_SECONDS, DEFAULT_TTL_SECONDS, Claim, ClaimState

__all__ = ["RedisDedupe"]

logger = logging.getLogger("usp_receiver")

_A = TypeVar("_A")
_T = TypeVar("_T")

_DONE = "d"
_PENDING_PREFIX = "p:"

# KEYS[1] = key, ARGV[1] = "p:<token>", ARGV[2] = lease in ms.
# Returns 1 if we took the key, else the value that is there ("d" or "p:<token>").
_CLAIM = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return 1
end
return redis.call('GET', KEYS[1])
"""

# KEYS[1] = key, ARGV[1] = "p:<token>", ARGV[2] = ttl in ms. Returns 1 if committed.
_COMMIT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('SET', KEYS[1], 'd', 'PX', ARGV[2])
    return 1
end
return 0
"""

# KEYS[1] = key, ARGV[1] = "p:<token>". Returns 1 if released.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""

_SCRIPTS = (_CLAIM, _COMMIT, _RELEASE)
_READ_SIZE = 65536
_CLAIM_AT, _COMMIT_AT, _RELEASE_AT = 0, 1, 2

#: A script call: which script, its key, its arguments.
_Call = tuple[int, str, tuple[str | int, ...]]
#: Who waits for a call's reply: a claim's caller, or nobody (a commit or a release).
_Waiter = asyncio.Future[Any] | None
#: A call written to the async line, who waits for its reply, and until when.
_Sent = tuple[_Call, _Waiter, float]


def _ms(seconds: float) -> int:
    """Redis wants whole milliseconds, and PX 0 is an error."""
    return max(1, round(seconds * 1000))


class RedisDedupe:
    """Dedupe across processes and hosts through Redis.

    Give it a sync ``client``, an ``async_client``, a ``url``, or a mix: the sync methods use
    ``client`` (created from ``url`` on first use if absent), the async methods use
    ``async_client`` (created from ``url`` on first use if absent). With a sync client and neither
    ``url`` nor ``async_client``, the async methods run the sync ones in a worker thread. The store
    opens a connection of its own for its sync calls and one for its async calls, with the
    client's settings (calls take turns on it, which is what lets a commit go out without
    waiting); ``close()``/``aclose()`` close them, and the clients created here. Clients passed in
    stay the caller's.

    Keys are ``prefix + event_id``. A commit after the lease ran out is a no-op even if nobody
    took the event over (Redis already dropped the key), so keep ``lease`` above your handler's
    worst-case run time. A commit whose reply is still unread when the process dies has been
    written to the socket already; if Redis never got it, the claim expires with its lease and a
    redelivery runs the handler again: nothing is lost.
    """

    def __init__(
        self,
        client: redis.Redis | None = None,
        *,
        url: str | None = None,
        async_client: redis.asyncio.Redis | None = None,
        prefix: str = "usp:dedupe:",
        lease: float = DEFAULT_LEASE_SECONDS,
        ttl: float = DEFAULT_TTL_SECONDS,
    ) -> None:
        if client is None and url is None and async_client is None:
            raise ValueError("RedisDedupe needs a client, an async_client or a url")
        if lease <= 0 or ttl <= 0:
            raise ValueError(f"lease and ttl must be positive, got lease={lease}, ttl={ttl}")
        self.prefix = prefix
        self.lease = lease
        self.ttl = ttl
        self._url = url
        self._lease_ms = _ms(lease)
        self._ttl_ms = _ms(ttl)
        self._lock = threading.Lock()
        self._client = client
        self._owns_client = False
        self._async_client = async_client
        self._owns_async_client = False
        self._line: _Line | None = None
        self._async_line: _AsyncLine | None = None

    # -- clients ---------------------------------------------------------------------------------

    def _sync(self) -> _Line:
        line = self._line
        if line is not None:
            return line
        with self._lock:
            if self._line is None:
                if self._client is None:
                    if self._url is None:
                        raise RuntimeError(
                            "RedisDedupe was given only an async_client: use the async methods, "
                            "or pass client= or url="
                        )
                    self._client = redis.Redis.from_url(self._url)
                    self._owns_client = True
                self._line = _Line(self._client)
            return self._line

    def _async(self) -> _AsyncLine | None:
        """The async line, or None when async calls must fall back to a thread."""
        line = self._async_line
        if line is not None or (self._url is None and self._async_client is None):
            return line
        # No await between check and set, so no other task can interleave; the lock guards
        # against another thread's event loop doing the same.
        with self._lock:
            if self._async_line is None:
                if self._async_client is None:
                    assert self._url is not None
                    self._async_client = redis.asyncio.Redis.from_url(self._url)
                    self._owns_async_client = True
                self._async_line = _AsyncLine(self._async_client)
            return self._async_line

    def close(self) -> None:
        """Give back the sync connection (reading what is unread) and close the client if ours."""
        with self._lock:
            line, self._line = self._line, None
            client = self._client if self._owns_client else None
            if client is not None:
                self._client = None
                self._owns_client = False
        if line is not None:
            line.close()
        if client is not None:
            client.close()

    async def aclose(self) -> None:
        """Give back every connection and close the clients created here (async ones on their loop)."""
        with self._lock:
            line, self._async_line = self._async_line, None
            client = self._async_client if self._owns_async_client else None
            if client is not None:
                self._async_client = None
                self._owns_async_client = False
        if line is not None:
            await line.close()
        if client is not None:
            await client.aclose()
        self.close()

    # -- helpers ---------------------------------------------------------------------------------

    def _claim_call(self, event_id: str, token: str) -> _Call:
        return (_CLAIM_AT, self.prefix + event_id, (_PENDING_PREFIX + token, self._lease_ms))

    def _end_call(self, claim: Claim, commit: bool) -> _Call | None:
        if claim.state is not ClaimState.NEW or not claim.token:
            return None
        key = self.prefix + claim.event_id
        if commit:
            return (_COMMIT_AT, key, (_PENDING_PREFIX + claim.token, self._ttl_ms))
        return (_RELEASE_AT, key, (_PENDING_PREFIX + claim.token,))

    @staticmethod
    def _claim_result(event_id: str, token: str, result: Any) -> Claim:
        # bytes by default, str with decode_responses=True.
        value = result.decode() if isinstance(result, bytes) else result
        # Our own token back means this claim was sent twice (a retry after a lost reply) and the
        # first one took the key.
        if result == 1 or value == _PENDING_PREFIX + token:
            return Claim(event_id, ClaimState.NEW, token)
        if value == _DONE:
            return Claim(event_id, ClaimState.DUPLICATE)
        return Claim(event_id, ClaimState.IN_PROGRESS)

    # -- sync ------------------------------------------------------------------------------------

    def claim(self, event_id: str) -> Claim:
        """NEW (run the handler), DUPLICATE (already processed) or IN_PROGRESS (held elsewhere)."""
        token = secrets.token_hex(8)
        return self._claim_result(event_id, token, self._sync().ask(self._claim_call(event_id, token)))

    def commit(self, claim: Claim) -> None:
        """Mark the id done for ``ttl``; a no-op unless ``claim`` still holds the id."""
        call = self._end_call(claim, commit=True)
        if call is not None:
            self._sync().tell(call)

    def release(self, claim: Claim) -> None:
        """Forget the id so the sender's retry runs again; a no-op unless ``claim`` still holds it."""
        call = self._end_call(claim, commit=False)
        if call is not None:
            self._sync().tell(call)

    # -- async -----------------------------------------------------------------------------------

    async def aclaim(self, event_id: str) -> Claim:
        """Async ``claim``."""
        line = self._async()
        if line is None:
            return await _in_thread(self.claim, event_id)
        token = secrets.token_hex(8)
        return self._claim_result(event_id, token, await line.ask(self._claim_call(event_id, token)))

    async def acommit(self, claim: Claim) -> None:
        """Async ``commit``."""
        await self._aend(claim, commit=True)

    async def arelease(self, claim: Claim) -> None:
        """Async ``release``."""
        await self._aend(claim, commit=False)

    async def _aend(self, claim: Claim, commit: bool) -> None:
        call = self._end_call(claim, commit)
        if call is None:
            return
        line = self._async()
        if line is None:
            await _in_thread(self.commit if commit else self.release, claim)
            return
        await line.tell(call)


class _Line:
    """One connection on which calls go out in order: ``tell`` writes without waiting, ``ask``
    writes and then reads every unread reply, its own last (Redis answers in order).

    Hand-written over a socket for speed: a claim and a commit, one after the other, cost 50 µs of
    CPU here (most of it the two system calls) against 65 µs through redis-py's
    ``send_packed_command``/``read_response`` on the same connection; bench/verify.py's sequential
    Redis row went from 288 to 259 µs an event. redis-py still parses the URL or client settings,
    as for the async line.
    """

    def __init__(self, client: redis.Redis) -> None:
        self._settings, self._tls = _settings_of(client.connection_pool)
        self._timeout = self._settings.get("socket_timeout") or 5.0
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._pid = 0  #: the process that opened the socket (a forked child opens its own)
        self._buffer = b""
        self._unread: list[_Call] = []

    def tell(self, call: _Call) -> None:
        with self._lock:
            self._send(call)

    def ask(self, call: _Call) -> Any:
        with self._lock:
            self._send(call)
            return self._drain()

    def close(self) -> None:
        with self._lock:
            if self._socket is None:
                return
            try:
                self._drain()
            except Exception:
                logger.exception("dedupe: commits or releases unconfirmed at close; claims will expire")
            self._drop()

    def _send(self, call: _Call) -> None:
        if self._pid != os.getpid():  # a forked child: the socket and its calls are the parent's
            self._socket, self._unread, self._buffer = None, [], b""
        self._unread.append(call)
        if self._socket is None:
            self._resend()
            return
        try:
            self._socket.sendall(_frame(call))
        except OSError:
            self._drop()  # the drain sends what is unread again

    def _drain(self) -> Any:
        reply: Any = None
        for attempt in (1, 2):
            try:
                if self._socket is None:
                    self._resend()
                assert self._socket is not None
                while self._unread:
                    reply = self._reply(self._socket)
                    if isinstance(reply, _resp.ReplyError) and reply.no_script:
                        raise reply
                    self._check(self._unread.pop(0), reply)
                break
            except (OSError, ValueError, _resp.ReplyError) as exc:
                # Once: what is unanswered goes again on a new connection (every call is
                # idempotent); twice: Redis is gone, and so are the calls.
                self._drop()
                if attempt == 2:
                    self._give_up()
                    error = redis.TimeoutError if isinstance(exc, TimeoutError) else redis.ConnectionError
                    raise error(f"dedupe: no answer from Redis: {exc}") from exc
                logger.info("dedupe: Redis line reset (%s); %d call(s) sent again", exc, len(self._unread))
        if isinstance(reply, _resp.ReplyError):
            raise redis.ResponseError(str(reply))
        return reply

    def _resend(self) -> None:
        """A new connection, and every unanswered call written to it in order, as sources (so a
        NOSCRIPT cannot come back: EVAL caches the scripts again)."""
        self._drop()
        try:
            self._socket = self._open()
            self._socket.sendall(b"".join(_frame(call, source=True) for call in self._unread))
        except OSError as exc:
            self._drop()
            self._give_up()
            raise redis.ConnectionError(f"dedupe: cannot reach Redis: {exc}") from exc
        except redis.RedisError:
            self._drop()
            self._give_up()
            raise

    def _give_up(self) -> None:
        lost, self._unread = self._unread, []
        if any(call[0] != _CLAIM_AT for call in lost):
            logger.warning("dedupe: a commit or release failed; its claim expires with its lease")

    @staticmethod
    def _check(call: _Call, reply: Any) -> None:
        if isinstance(reply, _resp.ReplyError) and call[0] != _CLAIM_AT:
            logger.warning("dedupe: a commit or release failed (%s); its claim expires with its lease", reply)

    def _reply(self, connection: socket.socket) -> Any:
        while (parsed := _resp.parse(self._buffer)) is None:
            chunk = connection.recv(_READ_SIZE)
            if not chunk:
                raise ConnectionError("Redis closed the connection")
            self._buffer += chunk
        reply, end = parsed
        self._buffer = self._buffer[end:]
        return reply

    def _open(self) -> socket.socket:
        """A new connection, authenticated, on the right database."""
        settings = self._settings
        timeout = settings.get("socket_connect_timeout") or self._timeout
        connection: socket.socket
        if settings.get("path"):
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            connection.settimeout(timeout)
            connection.connect(settings["path"])
        else:
            host = settings.get("host", "localhost")
            connection = socket.create_connection((host, settings.get("port", 6379)), timeout)
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls:
                connection = _tls_context(settings).wrap_socket(connection, server_hostname=host)
        connection.settimeout(self._timeout)
        self._buffer = b""
        for command in _handshake(settings):
            connection.sendall(_resp.pack(*command))
            reply = self._reply(connection)
            if isinstance(reply, _resp.ReplyError):
                connection.close()
                raise redis.ResponseError(f"Redis refused {command[0]}: {reply}")
        self._pid = os.getpid()
        return connection

    def _drop(self) -> None:
        if self._socket is not None and self._pid == os.getpid():
            self._socket.close()
        self._socket = None
        self._buffer = b""


class _AsyncLine:
    """The async calls' connection, pipelined: calls from concurrent tasks are written as they come
    and one reader task hands the replies, in order, to the futures waiting for them, so one
    event's round trip overlaps the next one's verification (auto-pipelining, as ioredis does).

    Hand-written over an asyncio stream for speed: with 8 deliveries in flight on one core,
    ``process_once`` costs about 40 µs of CPU per event here against 155 µs through
    ``redis.asyncio`` (its per-command overhead, hiredis or not; bench/verify.py measures both
    paths). redis-py still parses the URL or client settings it connects with: host and port or a
    unix socket, TLS (``rediss://``), username, password and database.
    """

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._settings, self._tls = _settings_of(client.connection_pool)
        self._timeout = self._settings.get("socket_timeout") or 5.0
        self._connecting = asyncio.Lock()
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        #: Calls written and not answered, in the order Redis answers them, with their deadline.
        #: (``None`` for a commit or release: nobody waits for its reply, which is only checked.)
        self._waiting: collections.deque[_Sent] = collections.deque()
        self._drained: asyncio.Event | None = None  #: set when nothing waits (``close`` asks)
        self._outgoing: list[bytes] = []
        #: Answers still to come for calls since sent again (see ``_send_again_in_order``).
        self._stale = 0
        #: One timer for the line, not one per call (that cost 6 µs a call): see ``_watch``.
        self._watchdog: asyncio.TimerHandle | None = None

    async def ask(self, call: _Call) -> Any:
        future = asyncio.get_running_loop().create_future()
        await self._send(call, future)
        return await future

    async def tell(self, call: _Call) -> None:
        await self._send(call, None)

    async def close(self) -> None:
        """Wait (briefly) for unanswered commits, then drop the connection."""
        if self._waiting and self._writer is not None:
            self._drained = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), self._timeout)
        async with self._connecting:
            writer, self._writer = self._writer, None
            if self._reader_task is not None:
                self._reader_task.cancel()
                self._reader_task = None
            if writer is not None:
                writer.close()

    async def _send(self, call: _Call, future: _Waiter) -> None:
        if self._writer is None:
            await self._connect()
        loop = asyncio.get_running_loop()
        self._waiting.append((call, future, loop.time() + self._timeout))
        self._arm_watchdog()
        # One write (one syscall) per turn of the event loop for every call made in that turn.
        if not self._outgoing:
            loop.call_soon(self._flush)
        self._outgoing.append(_frame(call))

    def _arm_watchdog(self) -> None:
        if self._watchdog is None and self._waiting:
            self._watchdog = asyncio.get_running_loop().call_at(self._waiting[0][2], self._watch)

    def _watch(self) -> None:
        """Fail the calls Redis left unanswered past their deadline, and drop the connection they
        wait on (the reader then reconnects and sends the others again: only those not expired)."""
        self._watchdog = None
        now = asyncio.get_running_loop().time()
        expired = False
        for _, future, deadline in self._waiting:
            if deadline > now:
                self._watchdog = asyncio.get_running_loop().call_at(deadline, self._watch)
                break
            if future is None or not future.done():
                _fail(future, redis.TimeoutError(f"no reply from Redis in {self._timeout} s"))
                expired = True
        if expired and self._writer is not None:
            self._writer.close()

    def _flush(self) -> None:
        frames, self._outgoing = self._outgoing, []
        # No writer: the connection broke meanwhile, and _recover sends these calls again.
        if frames and self._writer is not None:
            self._writer.write(b"".join(frames))

    async def _connect(self) -> asyncio.StreamWriter:
        async with self._connecting:
            if self._writer is None:
                self._writer = await self._open()
            return self._writer

    async def _open(self) -> asyncio.StreamWriter:
        """A new connection, authenticated, on the right database, with its reader task running."""
        settings = self._settings
        connect_timeout = settings.get("socket_connect_timeout") or self._timeout
        if settings.get("path"):
            opening = asyncio.open_unix_connection(settings["path"])
        else:
            opening = asyncio.open_connection(
                settings.get("host", "localhost"),
                settings.get("port", 6379),
                ssl=_tls_context(settings) if self._tls else None,
            )
        try:
            reader, writer = await asyncio.wait_for(opening, connect_timeout)
        except (OSError, TimeoutError) as exc:
            raise redis.ConnectionError(f"cannot connect to Redis: {exc}") from exc
        for command in _handshake(settings):
            writer.write(_resp.pack(*command))
            buffer = b""
            while (parsed := _resp.parse(buffer)) is None:
                chunk = await asyncio.wait_for(reader.read(_READ_SIZE), self._timeout)
                if not chunk:
                    raise redis.ConnectionError(f"Redis closed the connection at {command[0]}")
                buffer += chunk
            if isinstance(parsed[0], _resp.ReplyError):
                writer.close()
                raise redis.ResponseError(f"Redis refused {command[0]}: {parsed[0]}")
        self._reader_task = asyncio.create_task(self._read(reader, writer))
        return writer

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Whatever arrived, parsed in one go: one await per read, not per reply.
        buffer = b""
        try:
            while chunk := await reader.read(_READ_SIZE):
                buffer += chunk
                start = 0
                while (parsed := _resp.parse(buffer, start)) is not None:
                    reply, start = parsed
                    self._settle(reply, writer)
                buffer = buffer[start:]
            raise EOFError("Redis closed the connection")
        except Exception as exc:  # a broken stream, or a bug: either way, never leave calls unread
            await self._recover(exc, writer)

    def _settle(self, reply: Any, writer: asyncio.StreamWriter) -> None:
        if self._stale:
            self._stale -= 1  # the first answer to a call sent again (below)
            return
        call, future, deadline = self._waiting.popleft()
        if isinstance(reply, _resp.ReplyError) and reply.no_script:
            self._send_again_in_order((call, future, deadline), writer)
        elif isinstance(reply, _resp.ReplyError):
            _fail(future, redis.ResponseError(str(reply)))
        elif future is not None and not future.done():  # done: its caller timed out
            future.set_result(reply)
        if not self._waiting and self._drained is not None:
            self._drained.set()

    def _send_again_in_order(self, refused: _Sent, writer: asyncio.StreamWriter) -> None:
        """Redis lost its script cache (SCRIPT FLUSH, a failover) and refused ``refused``; the calls
        written after it already ran, before it (a claim after a release of the same id would find
        it still held). So send it and them again, as sources, in their order (each call is
        idempotent), and drop the answers still on their way to the first sending of those."""
        unsent = len(self._outgoing)  # the last calls of _waiting, written by the next _flush
        written = list(itertools.islice(self._waiting, 0, len(self._waiting) - unsent))
        self._stale += len(written)
        self._waiting.appendleft(refused)
        writer.write(b"".join(_frame(call, source=True) for call, _, _ in (refused, *written)))

    async def _recover(self, exc: BaseException, broken: asyncio.StreamWriter) -> None:
        """Reconnect and send every unanswered call again (all are idempotent), or fail them."""
        async with self._connecting:
            if self._writer is broken:
                self._writer = None
            calls, self._waiting = self._waiting, collections.deque()
            self._outgoing = []
            self._stale = 0
            broken.close()
            logger.info("dedupe: Redis connection lost (%s); %d call(s) to send again", exc, len(calls))
            try:
                writer = self._writer = await self._open()
            except Exception as failure:
                for _, future, _ in calls:
                    _fail(future, failure)
                return
            now = asyncio.get_running_loop().time()
            for call, future, deadline in calls:
                # Past its deadline the watchdog has answered its caller or logged it: given up.
                if deadline > now and (future is None or not future.done()):
                    self._waiting.append((call, future, deadline))
                    writer.write(_frame(call))
            self._arm_watchdog()


def _settings_of(pool: redis.ConnectionPool | redis.asyncio.ConnectionPool) -> tuple[dict[str, Any], bool]:
    """What a client connects with (host and port or a unix socket, username, password,
    database, TLS files), and whether it speaks TLS."""
    tls = issubclass(pool.connection_class, (redis.SSLConnection, redis.asyncio.SSLConnection))
    return dict(pool.connection_kwargs), tls


def _handshake(settings: dict[str, Any]) -> list[tuple[str | int, ...]]:
    """AUTH and SELECT, as the settings ask."""
    commands: list[tuple[str | int, ...]] = []
    if settings.get("password"):
        user = settings.get("username")
        commands.append(("AUTH", user, settings["password"]) if user else ("AUTH", settings["password"]))
    if settings.get("db"):
        commands.append(("SELECT", settings["db"]))
    return commands


def _frame(call: _Call, *, source: bool = False) -> bytes:
    at, key, args = call
    if source:  # EVAL also caches the script again for the EVALSHAs that follow
        return _resp.pack("EVAL", _SCRIPTS[at], 1, key, *args)
    return b"*%d\r\n%s%s" % (4 + len(args), _HEADS[at], _resp.bulks(key, *args))


def _tls_context(settings: dict[str, Any]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=settings.get("ssl_ca_certs"))
    if settings.get("ssl_certfile"):
        context.load_cert_chain(settings["ssl_certfile"], settings.get("ssl_keyfile"))
    if settings.get("ssl_cert_reqs") in ("none", ssl.CERT_NONE):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _sha1(script: str) -> str:
    """The name Redis gives a script (SHA-1 is Redis' choice, not a security measure)."""
    return hashlib.sha1(script.encode(), usedforsecurity=False).hexdigest()


#: Every EVALSHA frame of one script starts alike: EVALSHA, the sha, numkeys 1.
_HEADS = tuple(_resp.bulks("EVALSHA", _sha1(script), 1) for script in _SCRIPTS)


def _fail(future: _Waiter, exc: Exception) -> None:
    """Answer a waiting caller with ``exc``; for a commit or release nobody waits for, log it."""
    if future is None:
        logger.warning("dedupe: a commit or release failed (%s); its claim expires with its lease", exc)
    elif not future.done():
        future.set_exception(exc)


async def _in_thread(func: Callable[[_A], _T], arg: _A) -> _T:
    """Run a blocking call off the event loop (only when no async client can be had)."""
    return await anyio.to_thread.run_sync(func, arg)
