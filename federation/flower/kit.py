"""The deployment kit (``gastric-fl federation init``): a throw-away CA, the SuperLink's TLS certificate, one
SuperNode key pair per hospital, and what each site is handed.

Flower 1.41 secures a deployment in two independent ways (docs: "Enable TLS connections", "Authenticate
SuperNodes"):

* **TLS.** The SuperLink serves its Fleet, Control and runtime APIs on one HTTPS port with a server certificate
  (``--ssl-certfile/--ssl-keyfile/--ssl-ca-certfile``); every SuperNode and the ``flwr`` CLI verify it against the
  CA certificate (``--root-certificates`` / ``root-certificates`` in ``$FLWR_HOME/config.toml``). Its
  subjectAltName must name the address the others dial, so it always carries ``DNS:localhost`` and
  ``IP:127.0.0.1`` (loopback tests, the demo) plus every host name or IP given here.
* **SuperNode authentication.** With ``--enable-supernode-auth`` the SuperLink accepts only SuperNodes whose
  public key was registered with ``flwr supernode register KEY.pub``; a SuperNode signs its requests with the
  private key given as ``--auth-supernode-private-key``. Flower wants an elliptic-curve key on a NIST curve, the
  private key in OpenSSH format and the public key as one OpenSSH line (``ecdsa-sha2-nistp384 AAAA...``), which
  is what ``ssh-keygen -t ecdsa -b 384`` writes and what is written here with ``cryptography``
  (`federation.flower.kit_certs`).

Layout of a kit folder (``Kit.load`` reads it back)::

    KIT/
      .gastric-fl-kit            marker: this folder was made by ``federation init`` (overwrite is allowed)
      kit.toml                   server address and the hospitals (name, index); public
      ca/ca.key                  SECRET (0600): signs server certificates; keep offline, or delete after init
      ca/ca.crt                  public
      server/                    what the SuperLink machine keeps
        ca.crt  server.crt       public
        server.key               SECRET (0600)
        hospitals/<name>.pub     the hospitals' public keys, registered with the SuperLink
      hospitals/<name>/          the hand-over bundle of one hospital
        bundle.toml              name, index (partition id), server address HOST:PORT
        supernode.key            SECRET (0600): the hospital's SuperNode private key
        supernode.pub  ca.crt    public

Errors are ``FederationError`` (one line, exit 2 in the CLI).
"""

from __future__ import annotations

import base64
import ipaddress
import os
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from federation import runfiles
from federation.errors import FederationError
from federation.flower.kit_certs import make_ca, make_server_cert, new_key, openssh_private, openssh_public, pem_private
from infra.outputs import OutputError, atomic_target, foreign_entries, replace_folder
from infra.toml import toml_value

MARKER = ".gastric-fl-kit"
KIT_FORMAT = 1
DEFAULT_PORT = 8000  # Flower 1.41's SuperLink default (--port): Fleet, Control and runtime APIs on one port
SECRET_MODE = 0o600
PUBLIC_MODE = 0o644
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_HOST = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


@dataclass(frozen=True)
class HospitalBundle:
    """One hospital's hand-over folder: its SuperNode key pair, the CA certificate and ``bundle.toml``."""

    name: str
    index: int
    superlink: str
    folder: Path

    @property
    def private_key(self) -> Path:
        """The SuperNode's private key (OpenSSH format; secret, 0600): ``--auth-supernode-private-key``."""
        return self.folder / "supernode.key"

    @property
    def public_key(self) -> Path:
        """The SuperNode's public key (one OpenSSH line): what the server registers."""
        return self.folder / "supernode.pub"

    @property
    def ca_cert(self) -> Path:
        """The CA certificate the SuperNode verifies the SuperLink with: ``--root-certificates``."""
        return self.folder / "ca.crt"

    @property
    def bundle_toml(self) -> Path:
        """``bundle.toml``: name, index and server address."""
        return self.folder / "bundle.toml"


@dataclass(frozen=True)
class Kit:
    """A kit folder made by ``init_kit``; paths of the server side and of every hospital's bundle."""

    root: Path
    superlink: str
    hospitals: tuple[HospitalBundle, ...]
    server_only: bool = False  # loaded from the server/ hand-over folder alone

    @property
    def server_dir(self) -> Path:
        """What the SuperLink machine keeps."""
        return self.root if self.server_only else self.root / "server"

    @property
    def ca_cert(self) -> Path:
        """The CA certificate (public)."""
        return self.server_dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        """The CA private key (secret): only needed to issue a new server certificate."""
        return self.root / "ca" / "ca.key"

    @property
    def server_cert(self) -> Path:
        """The SuperLink's TLS certificate: ``--ssl-certfile``."""
        return self.server_dir / "server.crt"

    @property
    def server_key(self) -> Path:
        """The SuperLink's TLS private key (secret, 0600): ``--ssl-keyfile``."""
        return self.server_dir / "server.key"

    @property
    def port(self) -> int:
        """The SuperLink port from the server address."""
        return split_address(self.superlink)[1]

    @property
    def sources_file(self) -> Path:
        """The server's optional per-hospital source allow-list (`SOURCES_FILE`, `set_sources`)."""
        return self.server_dir / SOURCES_FILE

    def sources(self) -> dict[str, tuple[str, ...]]:
        """Each listed hospital's allowed source networks (``ipaddress`` notation, a bare address is a /32 or /128);
        a hospital not listed may connect from anywhere. One-line errors for an unknown hospital or address."""
        path = self.sources_file
        if not path.is_file():
            return {}
        table = _read_toml(path).get("sources", {})
        if not isinstance(table, dict):
            raise FederationError(f"{path}: [sources] must map hospital names to lists of addresses")
        known = {b.name for b in self.hospitals}
        out: dict[str, tuple[str, ...]] = {}
        for name, addresses in table.items():
            if name not in known:
                raise FederationError(f"{path}: {name!r} is not a hospital of this kit ({', '.join(sorted(known))})")
            out[name] = _check_networks(addresses, f"{path}: {name}")
        return out

    def fleet_key(self, name: str) -> str:
        """Hospital ``name``'s public key as its SuperNode sends it in every Fleet request (Flower 1.41's
        ``flwr-public-key`` header: base64 of the key's PEM SubjectPublicKeyInfo, ``flwr.supernode.
        node_auth_http_interceptor``), for the gate to tell which hospital a request claims to be."""
        key = serialization.load_ssh_public_key(self.public_key(name).read_bytes())
        pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        return base64.b64encode(pem).decode("ascii")

    def public_key(self, name: str) -> Path:
        """The registered public key of hospital ``name`` on the server side."""
        self.hospital(name)
        return self.server_dir / "hospitals" / f"{name}.pub"

    def hospital(self, name: str) -> HospitalBundle:
        """The bundle of hospital ``name``; a ``FederationError`` naming the known ones otherwise."""
        for bundle in self.hospitals:
            if bundle.name == name:
                return bundle
        known = ", ".join(b.name for b in self.hospitals) or "none"
        raise FederationError(f"the kit {self.root} has no hospital {name!r} (it has: {known})")

    @classmethod
    def load(cls, root: Path) -> Kit:
        """Read a kit folder made by ``init_kit``; one-line errors for a folder that is not one. A relative path is
        made absolute here: the gate (nginx) and the SuperLink resolve certificate paths against their own folders."""
        root = Path(root).absolute()
        server_only = (
            not (root / MARKER).is_file() and (root / "server.crt").is_file() and (root / "kit.toml").is_file()
        )
        if not (root / MARKER).is_file() and not server_only:
            raise FederationError(
                f"{root} is not a kit made by `gastric-fl federation init` (no {MARKER} in it) nor its server/ "
                "folder (no server.crt and kit.toml in it)"
            )
        data = _read_toml(root / "kit.toml")
        try:
            superlink = str(data["superlink"])
            entries = [(str(h["name"]), int(h["index"])) for h in data.get("hospital", [])]
        except (KeyError, TypeError, ValueError) as exc:
            raise FederationError(f"{root / 'kit.toml'} is damaged ({exc}); run `federation init` again") from exc
        bundles = tuple(HospitalBundle(n, i, superlink, root / "hospitals" / n) for n, i in entries)
        return cls(root=root, superlink=superlink, hospitals=bundles, server_only=server_only)


# -- public entry points ---------------------------------------------------------------------------------------------
hospital_name = runfiles.hospital_name  # a kit names hospital ``client`` as its folder is named in a run


def default_hospital_names(count: int) -> list[str]:
    """``client_00``, ``client_01``, ...: the names the engine gives hospitals' folders (``hospitals/client_XX``)."""
    if count < 1:
        raise FederationError(f"a federation needs at least one hospital, got {count}")
    return [hospital_name(i) for i in range(count)]


def init_kit(
    out: Path,
    hospitals: Sequence[str],
    *,
    host: str = "localhost",
    port: int = DEFAULT_PORT,
    extra_names: Iterable[str] = (),
    overwrite: bool = False,
    valid_days: int = 365,
) -> Kit:
    """Create a kit folder at ``out`` for ``hospitals`` (their order gives each its index / partition id).

    ``host:port`` is the SuperLink address written into every bundle; ``host`` and ``extra_names`` (host names or
    IP addresses) join ``localhost`` and ``127.0.0.1`` in the server certificate's subjectAltName. An existing
    non-empty ``out`` is refused unless it holds a kit's marker and ``overwrite`` is set; the new kit is built in a
    hidden sibling folder and swapped into place (`infra.outputs.replace_folder`), so a failure leaves the old one
    untouched, and files beside the kit's own entries in the old folder are kept.
    """
    names = _check_names(hospitals)
    _check_port(port)
    host = host.strip()
    sans = _check_sans([host, *extra_names])
    if valid_days < 1:
        raise FederationError(f"valid_days must be at least 1, got {valid_days}")
    out = Path(out)
    _check_target(out, overwrite)
    superlink = join_address(host, port)

    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        # replace only what init made (checked by _check_target): anything else at the top of the old kit (a
        # hospital group's notes) is carried into the new one; private (0700) from the start
        with replace_folder(out, keep=lambda name: name not in KIT_ENTRIES, mode=0o700) as staging:
            _build(staging, names, superlink, sans, valid_days)
    except OutputError as exc:
        raise FederationError(str(exc)) from None
    except OSError as exc:
        raise FederationError(f"cannot write the kit {out}: {exc.strerror or exc}") from exc
    return Kit.load(out)


def add_hospital(kit_root: Path, name: str) -> HospitalBundle:
    """Add hospital ``name`` to an existing kit: a new key pair, its bundle, and its public key on the server side.

    The new hospital takes the next index. The SuperLink only accepts it once its public key is registered
    (``flwr supernode register``; ``flwr_cli.FlwrCli.register_supernode``); nothing else changes for the others.
    """
    kit = Kit.load(kit_root)
    (name,) = _check_names([name])
    if any(b.name == name for b in kit.hospitals):
        raise FederationError(f"the kit {kit.root} already has a hospital {name!r}")
    index = max((b.index for b in kit.hospitals), default=-1) + 1
    ca_cert = kit.ca_cert.read_bytes()
    _write_hospital(kit.root, name, index, kit.superlink, ca_cert)
    entries = [(b.name, b.index) for b in kit.hospitals] + [(name, index)]
    _write_public(kit.root / "kit.toml", _kit_toml(kit.superlink, entries))
    _write_public(kit.server_dir / "kit.toml", _kit_toml(kit.superlink, entries))
    return Kit.load(kit.root).hospital(name)


SOURCES_FILE = "sources.toml"  # in the server's folder: [sources] hospital = ["10.1.2.0/24", ...]


def set_sources(kit_root: Path, name: str, addresses: Sequence[str], *, everyone: bool = False) -> tuple[str, ...]:
    """Allow hospital ``name``'s SuperNode to connect to the gate only from ``addresses`` (networks or addresses;
    empty: from anywhere again). Written to the server's `SOURCES_FILE`; the gate enforces it from its next start
    and logs every request with the hospital it claims to be and whether its source was allowed. A network of every
    address (``0.0.0.0/0``, ``::/0``) is refused unless ``everyone`` says it is meant; a zone id always is."""
    kit = Kit.load(kit_root)
    kit.hospital(name)
    networks = _check_networks(list(addresses), f"--source for {name}", everyone=everyone)
    table = dict(kit.sources())
    if networks:
        table[name] = networks
    else:
        table.pop(name, None)
    lines = [
        "# Where each hospital's SuperNode may connect from (gastric-fl federation allow; docs/deployment.md).",
        "# A hospital not listed may connect from any address. The gate applies it when it starts.",
        "[sources]",
        *(f"{toml_value(n)} = [{', '.join(toml_value(a) for a in nets)}]" for n, nets in sorted(table.items())),
    ]
    _write_public(kit.sources_file, ("\n".join(lines) + "\n").encode())
    return networks


def _check_networks(addresses: object, where: str, *, everyone: bool = True) -> tuple[str, ...]:
    """``addresses`` as networks in ``ipaddress`` notation, each one nginx's ``geo`` module can match
    (https://nginx.org/en/docs/http/ngx_http_geo_module.html: addresses and CIDR networks, no IPv6 zone id such as
    ``%eth0``); one-line errors naming ``where``. ``everyone=False`` also refuses a network of every address
    (``0.0.0.0/0``, ``::/0``: `everyone_networks`), which must then be asked for explicitly."""
    if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
        raise FederationError(f'{where}: give a list of addresses or networks, e.g. ["10.1.2.0/24"]')
    out = []
    for address in addresses:
        if "%" in address:
            raise FederationError(
                f"{where}: {address!r} carries an IPv6 zone id ({address[address.index('%') :]!r}), which the gate "
                "(nginx) cannot match: give the address without it, or the hospital's routable address"
            )
        try:
            network = ipaddress.ip_network(address.strip(), strict=False)
        except ValueError:
            raise FederationError(f"{where}: {address!r} is not an IP address or network (e.g. 10.1.2.0/24)") from None
        if network.prefixlen == 0 and not everyone:
            raise FederationError(
                f"{where}: {network} allows every IPv{network.version} address, i.e. everyone, as if there were no "
                "list: give the hospital's own network, or pass --everyone to mean it"
            )
        out.append(str(network))
    return tuple(out)


def everyone_networks(networks: Sequence[str]) -> list[str]:
    """The networks of ``networks`` that hold every address of their family (``0.0.0.0/0``, ``::/0``)."""
    return [n for n in networks if ipaddress.ip_network(n).prefixlen == 0]


def load_bundle(folder: Path) -> HospitalBundle:
    """Read a hospital's hand-over folder (``bundle.toml`` and the files next to it); one-line errors."""
    folder = Path(folder).absolute()  # the SuperNode and the gate resolve relative paths elsewhere
    if folder.is_file() and folder.name == "bundle.toml":
        folder = folder.parent
    data = _read_toml(folder / "bundle.toml")
    try:
        bundle = HospitalBundle(str(data["name"]), int(data["index"]), str(data["superlink"]), folder)
    except (KeyError, TypeError, ValueError) as exc:
        raise FederationError(f"{folder / 'bundle.toml'} lacks name, index or superlink ({exc})") from exc
    split_address(bundle.superlink)
    for path in (bundle.private_key, bundle.ca_cert):
        if not path.is_file():
            raise FederationError(f"the hospital bundle {folder} lacks {path.name}; copy the whole bundle folder")
    return bundle


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) as ``(host, port)``; a ``FederationError`` when malformed."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise FederationError(f"server address {address!r} must be HOST:PORT, e.g. fl.example.org:{DEFAULT_PORT}")
    port = int(port_text)
    _check_port(port)
    return host.removeprefix("[").removesuffix("]"), port


def join_address(host: str, port: int) -> str:
    """``HOST:PORT``, with brackets around an IPv6 address."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# -- building the folder ---------------------------------------------------------------------------------------------
def _build(root: Path, names: list[str], superlink: str, sans: list[x509.GeneralName], valid_days: int) -> None:
    ca_key, ca_cert = make_ca(valid_days)
    server_key, server_cert = make_server_cert(ca_key, ca_cert, sans, valid_days)
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    for folder in (root / "ca", root / "server" / "hospitals", root / "hospitals"):
        folder.mkdir(parents=True)
    # private folders whatever the umask: the CA key, the server key, every hospital's key live below them
    for folder in (root, root / "ca", root / "server", root / "server" / "hospitals", root / "hospitals"):
        os.chmod(folder, 0o700)
    write_secret(root / "ca" / "ca.key", pem_private(ca_key))
    _write_public(root / "ca" / "ca.crt", ca_pem)
    _write_public(root / "server" / "ca.crt", ca_pem)
    _write_public(root / "server" / "server.crt", server_cert.public_bytes(serialization.Encoding.PEM))
    write_secret(root / "server" / "server.key", pem_private(server_key))
    for index, name in enumerate(names):
        _write_hospital(root, name, index, superlink, ca_pem)
    kit_toml = _kit_toml(superlink, list(zip(names, range(len(names)), strict=True)))
    _write_public(root / "kit.toml", kit_toml)
    _write_public(root / "server" / "kit.toml", kit_toml)  # the server/ hand-over starts a server on its own
    _write_public(root / MARKER, f"# made by `gastric-fl federation init`; format {KIT_FORMAT}\n".encode())


def _write_hospital(root: Path, name: str, index: int, superlink: str, ca_pem: bytes) -> None:
    folder = root / "hospitals" / name
    folder.mkdir(parents=True)
    os.chmod(folder, 0o700)
    key = new_key()
    public = openssh_public(key, comment=name)
    write_secret(folder / "supernode.key", openssh_private(key))
    _write_public(folder / "supernode.pub", public)
    _write_public(folder / "ca.crt", ca_pem)
    text = (
        "# Hand-over bundle of one hospital (gastric-fl federation init). Keep supernode.key secret.\n"
        f"name = {toml_value(name)}\n"
        f"index = {index}\n"
        f"superlink = {toml_value(superlink)}\n"
    )
    _write_public(folder / "bundle.toml", text.encode())
    _write_public(root / "server" / "hospitals" / f"{name}.pub", public)


def _kit_toml(superlink: str, entries: Sequence[tuple[str, int]]) -> bytes:
    lines = [
        "# A deployment kit made by `gastric-fl federation init` (see docs/deployment.md).",
        f"superlink = {toml_value(superlink)}",
    ]
    for name, index in entries:
        lines += ["", "[[hospital]]", f"name = {toml_value(name)}", f"index = {index}"]
    return ("\n".join(lines) + "\n").encode()


def write_secret(path: Path, data: bytes, *, replace: bool = False) -> None:
    """Create ``path`` with mode 0600 from the start (never briefly world-readable); ``replace``: remove an older
    file of that name first."""
    if replace:
        path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, SECRET_MODE)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, SECRET_MODE)  # in case a umask or an inherited ACL changed it


def _write_public(path: Path, data: bytes) -> None:
    with atomic_target(path) as tmp:
        tmp.write_bytes(data)
        os.chmod(tmp, PUBLIC_MODE)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError as exc:
        raise FederationError(f"{path} does not exist; is this a kit or bundle made by `federation init`?") from exc
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise FederationError(f"cannot read {path}: {exc}") from exc


# -- input checks ----------------------------------------------------------------------------------------------------
def _check_names(hospitals: Sequence[str]) -> list[str]:
    names = [str(n).strip() for n in hospitals]
    if not names:
        raise FederationError("a kit needs at least one hospital name")
    for name in names:
        if not _NAME.match(name):
            raise FederationError(
                f"hospital name {name!r} must be 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit"
            )
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise FederationError(f"hospital names must be unique; repeated: {', '.join(duplicates)}")
    return names


def _check_port(port: int) -> None:
    if not 1 <= int(port) <= 65535:
        raise FederationError(f"port must be between 1 and 65535, got {port}")


def _check_sans(hosts: Iterable[str]) -> list[x509.GeneralName]:
    """``localhost``, ``127.0.0.1`` and every other host as a DNS name or IP address, without repeats."""
    sans: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    for raw in hosts:
        text = raw.strip().removeprefix("[").removesuffix("]")
        if not text:
            raise FederationError("an empty host name cannot go into the server certificate")
        san: x509.GeneralName
        try:
            san = x509.IPAddress(ipaddress.ip_address(text))
        except ValueError:
            if not _HOST.match(text):
                raise FederationError(
                    f"{raw!r} is neither an IP address nor a host name (letters, digits, '-' and '.')"
                ) from None
            san = x509.DNSName(text.lower())
        if san not in sans:
            sans.append(san)
    return sans


def _check_target(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise FederationError(f"{out} is a file; choose a folder for the kit")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not (out / MARKER).is_file():
        raise FederationError(f"{out} is not empty and was not made by `federation init`; choose another folder")
    if not overwrite:
        raise FederationError(f"{out} already holds a kit; pass --overwrite to replace it (all its keys change)")
    # the project's ownership check (infra.outputs.foreign_entries) over what init and --add write; entries
    # beside the kit's own folders are not the kit's and are kept
    foreign = [e for e in foreign_entries(out, "federation init", KIT_PATTERNS) if e.split("/", 1)[0] in KIT_DIRS]
    if foreign:
        raise FederationError(
            f"{out / foreign[0].rstrip('/')} inside the kit {out} was not made by `federation init`: move it out "
            "first (--overwrite replaces only what init made)"
        )


KIT_DIRS = ("ca", "server", "hospitals")
KIT_ENTRIES = (MARKER, "kit.toml", *KIT_DIRS)  # what init makes at the top of a kit
KIT_PATTERNS = (  # what init and --add write below them (fnmatch patterns, folders end with /)
    "ca/",
    "ca/ca.key",
    "ca/ca.crt",
    "server/",
    "server/ca.crt",
    "server/server.crt",
    "server/server.key",
    "server/kit.toml",
    "server/hospitals/",
    "server/hospitals/*.pub",
    "hospitals/",
    "hospitals/*/",
    "hospitals/*/supernode.key",
    "hospitals/*/supernode.pub",
    "hospitals/*/ca.crt",
    "hospitals/*/bundle.toml",
)
