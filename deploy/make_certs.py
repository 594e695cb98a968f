"""Create what a TLS + SuperNode-authenticated federation needs.

    python deploy/make_certs.py OUT_DIR --hosts 127.0.0.1 localhost superlink.lan --nodes 3

OUT_DIR/ca.pem, ca.key          certificate authority (keep ca.key offline)
OUT_DIR/server.pem, server.key  SuperLink certificate, valid for every --hosts name or IP
OUT_DIR/node-<i>, node-<i>.pub  ECDSA (P-384) key pair of SuperNode i, OpenSSH format:
                                register the .pub with `flwr supernode register`, give the
                                private key to that node (--auth-supernode-private-key)
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        os.chmod(path, 0o600)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _cert(subject: x509.Name, issuer: x509.Name, public_key, sign_key, days: int,
          is_ca: bool, san: list[x509.GeneralName] | None = None) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
               .public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5))
               .not_valid_after(now + dt.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True))
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(sign_key, hashes.SHA256())


def make_ca(out: Path, days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP384R1())
    cert = _cert(_name("fedapps CA"), _name("fedapps CA"), key.public_key(), key, days, True)
    _write(out / "ca.key", key.private_bytes(serialization.Encoding.PEM,
                                             serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()), private=True)
    _write(out / "ca.pem", cert.public_bytes(serialization.Encoding.PEM))
    return key, cert


def make_server(out: Path, ca_key, ca_cert, hosts: list[str], days: int) -> None:
    key = ec.generate_private_key(ec.SECP384R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = _cert(_name(hosts[0]), ca_cert.subject, key.public_key(), ca_key, days, False, names)
    _write(out / "server.key", key.private_bytes(serialization.Encoding.PEM,
                                                 serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()), private=True)
    _write(out / "server.pem", cert.public_bytes(serialization.Encoding.PEM))


def make_node_key(out: Path, index: int) -> None:
    key = ec.generate_private_key(ec.SECP384R1())
    _write(out / f"node-{index}", key.private_bytes(serialization.Encoding.PEM,
                                                    serialization.PrivateFormat.OpenSSH,
                                                    serialization.NoEncryption()), private=True)
    _write(out / f"node-{index}.pub", key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))


def make_all(out: Path, hosts: list[str], nodes: int, days: int = 365) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = make_ca(out, days)
    make_server(out, ca_key, ca_cert, hosts, days)
    for i in range(nodes):
        make_node_key(out, i)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--hosts", nargs="+", default=["127.0.0.1", "localhost"],
                   help="names and IPs the SuperLink is reached at")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--days", type=int, default=365)
    args = p.parse_args()
    make_all(args.out, args.hosts, args.nodes, args.days)
    print(f"wrote CA, server certificate and {args.nodes} node key pairs to {args.out}")


if __name__ == "__main__":
    main()
