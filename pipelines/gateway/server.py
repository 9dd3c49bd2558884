"""The gateway's asyncio server: frames in, handlers concurrently, responses out in request order.

Each connection reads frames as they come and starts a handler for each; a writer sends the
answers in the order of the requests (Kafka's rule for one connection), so a long-polling fetch
holds up only the requests after it on its own connection. Blocking catalog and Iceberg work runs
in threads. A frame that cannot be a request (a size out of bounds, bytes that do not decode, a
(key, version) the gateway does not serve other than ApiVersions) closes its connection and
nothing else.

With SASL users, a connection must authenticate (SaslHandshake, then SaslAuthenticate or, after
a v0 handshake, raw SASL tokens) before anything but ApiVersions is answered; any other request
first, or a failed authentication, closes it. Until it is in, each request is answered before
the next frame is read, since the SASL state decides what the next frame may be.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from typing import Any

from kio.schema.errors import ErrorCode
from pyiceberg.catalog import Catalog

from icelog.pipelines.gateway import admin, fetch, metadata, sasl, wire
from icelog.pipelines.gateway.groups import Coordinator
from icelog.pipelines.gateway.produce import Acked, Appender
from icelog.pipelines.gateway.records import CorruptRecords, decode_batches
from icelog.pipelines.gateway.topics import SYSTEM_NAMESPACE, table_name, valid_timestamp
from icelog.pipelines.gateway.transactions import Transactions
from icelog.storage import errors
from icelog.storage.core.system import ensure_system_table
from icelog.storage.groups.offsets import list_groups
from icelog.storage.log.table import LogTable
from icelog.storage.producers.idempotent import SYSTEM_TABLE
from icelog.storage.properties import NEXT_PRODUCER_ID

log = logging.getLogger(__name__)

PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS, CREATE_TOPICS, INIT_PRODUCER_ID = 0, 1, 2, 3, 18, 19, 22
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 8, 9, 10, 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS, DELETE_TOPICS, DESCRIBE_CONFIGS, DESCRIBE_CLUSTER = 15, 16, 20, 32, 60
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
BEFORE_AUTHENTICATION = {API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE}
ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 24, 25, 26, 28
GROUP_APIS = {OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP}
GROUP_APIS |= {DESCRIBE_GROUPS, LIST_GROUPS}


class Gateway:
    """One ``icelog serve`` process: a listening socket over one catalog."""

    def __init__(
        self,
        catalog: Catalog,
        host: str = "127.0.0.1",
        port: int = 0,
        linger_ms: float = 5.0,
        users: sasl.Users | None = None,
        advertised_host: str | None = None,
    ) -> None:
        self.catalog = catalog
        self.host = host
        self.port = port
        self.users = users  # None: no authentication (loopback only, checked by the CLI)
        self.advertised_host = advertised_host or host  # the address Metadata and FindCoordinator name
        self.appender = Appender(catalog, linger_ms)
        self.partitions: dict[str, int] = {}  # partition counts seen (they only grow)
        self.stopping = False
        self._stop: asyncio.Event | None = None
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.Task] = set()
        self.coordinator = Coordinator(catalog)
        self.transactions = Transactions(catalog)
        self._reaper: asyncio.Task | None = None
        self.recovery: asyncio.Task | None = None  # the start-up recovery of the transaction journal

    async def start(self) -> None:
        # The producer-id allocator exists before the first InitProducerId (creating it takes a
        # while, and a client gives up on the bootstrap connection meanwhile).
        await asyncio.to_thread(ensure_system_table, self.catalog, SYSTEM_TABLE, {NEXT_PRODUCER_ID: "0"})
        self._stop = asyncio.Event()
        self.server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        self._reaper = asyncio.create_task(self.coordinator.run())
        # After the listener is up: a long recovery holds up no client.
        self.recovery = asyncio.create_task(self.transactions.recover())

    async def stop(self, grace: float = 10.0) -> None:
        """Stop accepting, commit every queued batch and send its answer, close the connections,
        let the start-up recovery finish, then bring the transaction journal up to date
        (``Transactions.close``)."""
        self.stopping = True
        if self._stop is not None:
            self._stop.set()
        if self.server is not None:
            self.server.close()
        if self._reaper is not None:
            self._reaper.cancel()
        self.coordinator.close()
        await self.appender.close()
        if self.connections:
            await asyncio.wait(self.connections, timeout=grace)
        for task in self.connections:
            task.cancel()
        if self.recovery is not None:  # its thread cannot be cancelled: the journal steps it takes finish
            await self.recovery
        await self.transactions.close()

    # --- connections ---------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        answers: asyncio.Queue[asyncio.Task | None] = asyncio.Queue()
        sender = asyncio.create_task(self._send(answers, writer))
        # Produce requests queue their batches in request order (a producer pipelines several
        # requests, and its sequences must reach the table in the order sent): the lock is fair,
        # and handlers start in the order their requests arrived.
        queueing = asyncio.Lock()
        session = Session(self.users)
        try:
            while not self.stopping:
                frame = await self._frame(reader, *session.frame_sizes())
                if frame is None:
                    break
                handler = self._raw_token(session, frame) if session.raw else self._dispatch(frame, queueing, session)
                if handler is None:
                    break
                answer = asyncio.create_task(handler)
                answers.put_nowait(answer)
                if not session.authenticated:
                    await asyncio.wait({answer})
                    if session.closing:
                        break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            answers.put_nowait(None)
            with contextlib.suppress(Exception):
                await sender
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self.connections.discard(task)

    async def _frame(self, reader: asyncio.StreamReader, smallest: int = 8, largest: int = wire.MAX_FRAME_BYTES) -> bytes | None:
        """The next request frame, or None for a closed or unacceptable stream."""
        assert self._stop is not None
        stop = asyncio.ensure_future(self._stop.wait())
        read = asyncio.ensure_future(reader.readexactly(4))
        done, _ = await asyncio.wait({read, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if read not in done:
            read.cancel()
            return None
        (size,) = struct.unpack(">i", read.result())
        if not smallest <= size <= largest:
            log.warning("closing a connection: frame size %d", size)
            return None
        return await reader.readexactly(size)

    async def _send(self, answers: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
        while (task := await answers.get()) is not None:
            try:
                data = await task
            except Exception:  # noqa: BLE001 - a handler's unexpected failure ends its connection, not the server
                log.exception("closing a connection: a request failed")
                writer.close()
                return
            if data is None:
                continue
            writer.write(data)
            await writer.drain()

    def _dispatch(self, frame: bytes, queueing: asyncio.Lock, session: Session):
        """A coroutine answering ``frame`` (bytes or None for no answer), or None to close."""
        try:
            api_key, version, correlation_id = wire.peek(frame)
        except wire.FrameError:
            return None
        if not session.authenticated and api_key not in BEFORE_AUTHENTICATION:
            # As a Kafka broker does: no answer, which would tell an unauthenticated client something.
            log.warning("closing a connection: api key %d before SASL authentication", api_key)
            return None
        if self.users is not None and session.authenticated and api_key in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
            log.warning("closing a connection: SASL again after authenticating (re-authentication is not served)")
            return None
        if not wire.supported(api_key, version):
            if api_key == API_VERSIONS:
                return _ready(wire.api_versions_error(correlation_id))
            log.warning("closing a connection: api key %d version %d is not served", api_key, version)
            return None
        try:
            request = wire.parse_request(frame)
        except wire.FrameError as e:
            log.warning("closing a connection: %s", e)
            return None
        return self._answer(request, queueing, session)

    async def _answer(self, request: wire.Request, queueing: asyncio.Lock, session: Session) -> bytes | None:
        body = request.body
        if request.api_key == SASL_HANDSHAKE:
            data = session.handshake(body.mechanism, request.api_version)
        elif request.api_key == SASL_AUTHENTICATE:
            data = await session.authenticate(body.auth_bytes)
        elif request.api_key == PRODUCE:
            data = await self._produce(body, queueing)
            if body.acks == 0:
                return None
        elif request.api_key == FETCH:
            data = await fetch.handle_fetch(self, body)
        elif request.api_key == LIST_OFFSETS:
            data = await asyncio.to_thread(fetch.list_offsets, self.catalog, body)
        elif request.api_key == METADATA:
            data = await asyncio.to_thread(metadata.metadata, self.catalog, body, self.advertised_host, self.port)
        elif request.api_key == CREATE_TOPICS:
            data = await asyncio.to_thread(metadata.create_topics, self.catalog, body)
        elif request.api_key == INIT_PRODUCER_ID and body.transactional_id is not None:
            data = await self.transactions.init(body)
        elif request.api_key == INIT_PRODUCER_ID:
            data = await asyncio.to_thread(metadata.init_producer_id, self.catalog, body)
        elif request.api_key == ADD_PARTITIONS_TO_TXN:
            data = await self.transactions.add_partitions(body)
        elif request.api_key == ADD_OFFSETS_TO_TXN:
            data = await self.transactions.add_offsets(body)
        elif request.api_key == TXN_OFFSET_COMMIT:
            data = await self.transactions.commit_offsets(body)
        elif request.api_key == END_TXN:
            data = await self.transactions.end(body)
        elif request.api_key in GROUP_APIS:
            data = await self._group(request)
        elif request.api_key == DELETE_TOPICS:
            data, dropped = await asyncio.to_thread(admin.delete_topics, self.catalog, body)
            for name in dropped:
                self.partitions.pop(name, None)  # a table created again under the name may have fewer
        elif request.api_key == DESCRIBE_CONFIGS:
            data = await asyncio.to_thread(admin.describe_configs, self.catalog, body)
        elif request.api_key == DESCRIBE_CLUSTER:
            data = admin.describe_cluster(self.catalog, self.advertised_host, self.port)
        else:
            data = metadata.api_versions(body)
        return wire.encode_response(request.api_key, request.api_version, request.correlation_id, data)

    async def _raw_token(self, session: Session, token: bytes) -> bytes | None:
        """After a v0 SaslHandshake: a token without a Kafka header, answered the same way, or
        None (the connection closes) when authentication fails."""
        answer = await session.step(token)
        return None if answer is None else struct.pack(">i", len(answer)) + answer

    # --- consumer groups ---------------------------------------------------------------------------

    async def _group(self, request: wire.Request) -> dict[str, Any]:
        body, version, groups = request.body, request.api_version, self.coordinator
        if request.api_key == FIND_COORDINATOR:
            return metadata.find_coordinator(body, version, self.advertised_host, self.port)
        if request.api_key == JOIN_GROUP:
            return await groups.join(body, version, request.client_id)
        if request.api_key == SYNC_GROUP:
            return await groups.sync(body)
        if request.api_key == HEARTBEAT:
            return await groups.heartbeat(body)
        if request.api_key == LEAVE_GROUP:
            return await groups.leave(body, version)
        if request.api_key == OFFSET_COMMIT:
            return await groups.commit(body)
        if request.api_key == OFFSET_FETCH:
            return await asyncio.to_thread(groups.fetch_offsets, body, version)
        recorded = await asyncio.to_thread(list_groups, self.catalog)
        if request.api_key == LIST_GROUPS:
            return groups.list(body, recorded)
        return groups.describe(body, recorded)

    # --- produce -------------------------------------------------------------------------------

    async def _produce(self, request: Any, queueing: asyncio.Lock) -> dict[str, Any]:
        waits: list[tuple[str, int, asyncio.Future | Acked]] = []
        async with queueing:
            for topic in request.topic_data:
                for part in topic.partition_data:
                    submitted = await self._submit(topic.name, part.index, part.records, request.transactional_id)
                    waits.append((topic.name, part.index, submitted))
        responses: dict[str, list[dict[str, Any]]] = {}
        for topic_name, partition, wait in waits:
            ack = wait if isinstance(wait, Acked) else await wait
            responses.setdefault(topic_name, []).append(
                {
                    "index": partition,
                    "error_code": ack.error,
                    "base_offset": ack.base_offset,
                    "log_start_offset": -1,
                    "error_message": ack.message,
                }
            )
        return {"responses": [{"name": t, "partition_responses": ps} for t, ps in responses.items()]}

    async def _submit(
        self, topic: str, partition: int, records: bytes | None, transactional_id: str | None = None
    ) -> asyncio.Future | Acked:
        """Check one partition's batches and queue them; an Acked for what is refused before any commit."""
        if topic.split(".")[0] == SYSTEM_NAMESPACE:
            return Acked(ErrorCode.topic_authorization_failed, message=f"{topic}: icelog's system tables are not writable")
        name = table_name(topic)
        if name is None or not await self._has_partition(name, partition):
            return Acked(ErrorCode.unknown_topic_or_partition, message=f"{topic} has no partition {partition}")
        try:
            # In a thread: decoding a large request takes long enough to hold up every connection.
            batches = await asyncio.to_thread(decode_batches, records or b"")
        except CorruptRecords as e:
            return Acked(ErrorCode.corrupt_message, message=str(e))
        if not batches or any(not len(b) for b in batches):
            return Acked(ErrorCode.invalid_record, message="a produce needs at least one record in every batch")
        if not all(valid_timestamp(int(t)) for b in batches for t in (b.timestamps_ms.min(), b.timestamps_ms.max())):
            # Checked here, not at commit: one client's bad record must not fail a commit it shares.
            return Acked(ErrorCode.invalid_timestamp, message="a record timestamp outside years 1970 to 9999")
        if any(b.control for b in batches):  # markers are the coordinator's to write, and icelog writes none
            return Acked(ErrorCode.invalid_record, message="a control batch is not a client's to produce")
        if any(b.transactional for b in batches):
            # Staged in order: the connection's later requests wait (the fair lock) until this one's turn came.
            return asyncio.ensure_future(self.transactions.stage(transactional_id, name, partition, batches))
        if len(batches) > 1 and any(b.idempotent for b in batches):
            return Acked(ErrorCode.invalid_record, message="an idempotent producer sends one batch per partition and request")
        futures = [self.appender.submit(name, partition, b) for b in batches]
        return asyncio.ensure_future(_first_offset(futures))

    async def _has_partition(self, name: str, partition: int) -> bool:
        if partition < 0:
            return False
        if partition >= self.partitions.get(name, 0):
            try:
                self.partitions[name] = await asyncio.to_thread(lambda: LogTable(self.catalog, name).state().partitions)
            except errors.IcelogError:
                return False
        return partition < self.partitions[name]


async def _first_offset(futures: list[asyncio.Future]) -> Acked:
    acks = [await f for f in futures]
    failed = next((a for a in acks if a.error != ErrorCode.none), None)
    return failed or acks[0]


async def _ready(data: bytes) -> bytes:
    return data


class Session:
    """One connection's SASL state: in at once without users, else after an exchange succeeds."""

    def __init__(self, users: sasl.Users | None) -> None:
        self.users = users
        self.authenticated = users is None
        self.exchange: sasl.Exchange | None = None
        self.raw = False  # a v0 handshake: the next frames are raw SASL tokens
        self.closing = False  # answer this request, then close

    def frame_sizes(self) -> tuple[int, int]:
        """(smallest, largest) size of the next frame: a raw SASL token may be shorter than a
        request header, and before authentication a frame is small (as Kafka's
        ``sasl.server.max.receive.size``), so a stranger cannot make the gateway buffer 64 MiB."""
        largest = wire.MAX_FRAME_BYTES if self.authenticated else sasl.MAX_UNAUTHENTICATED_BYTES
        return (0 if self.raw else 8), largest

    def handshake(self, mechanism: str, version: int) -> dict[str, Any]:
        if self.users is None:  # what a broker's listener without SASL answers
            return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": []}
        if self.exchange is not None:  # a second handshake mid-exchange
            self.closing = True
            return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": list(sasl.MECHANISMS)}
        if mechanism not in sasl.MECHANISMS:
            self.closing = True
            return {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": list(sasl.MECHANISMS)}
        self.exchange = sasl.Exchange(self.users, mechanism)
        self.raw = version == 0
        return {"error_code": ErrorCode.none, "mechanisms": list(sasl.MECHANISMS)}

    async def authenticate(self, token: bytes) -> dict[str, Any]:
        if self.exchange is None or self.authenticated:
            self.closing = True
            return {"error_code": ErrorCode.illegal_sasl_state, "error_message": "SaslAuthenticate without a SaslHandshake"}
        answer = await self.step(token)
        if answer is None:
            return {
                "error_code": ErrorCode.sasl_authentication_failed,
                "error_message": "Authentication failed: invalid credentials",
            }
        return {"error_code": ErrorCode.none, "auth_bytes": answer}  # session lifetime 0: no re-authentication

    async def step(self, token: bytes) -> bytes | None:
        """The server's next token, or None (and ``closing``) when the client failed."""
        assert self.exchange is not None
        try:
            # In a thread: checking a PLAIN password runs PBKDF2.
            answer = await asyncio.to_thread(self.exchange.step, token)
        except sasl.AuthenticationFailed as e:
            log.warning("closing a connection: SASL %s authentication failed (%s)", self.exchange.mechanism, e)
            self.closing = True
            return None
        if self.exchange.done:
            log.info("authenticated %r by SASL %s", self.exchange.user, self.exchange.mechanism)
            self.authenticated, self.raw = True, False
        return answer
