"""An authoritative DNS server on loopback for the pool-discovery test: dnslib's server,
answering A queries from a zone file that it reads again on every query (so the test changes
the answer by rewriting the file). Prints "ready" once it listens."""

import argparse
import sys
import time

from dnslib import QTYPE, RCODE, RR
from dnslib.server import BaseResolver, DNSLogger, DNSServer


class ZoneFileResolver(BaseResolver):
    def __init__(self, path):
        self.path = path

    def resolve(self, request, handler):
        reply = request.reply()
        qname = request.q.qname
        try:
            with open(self.path) as f:
                records = RR.fromZone(f.read())
        except Exception:
            records = []
        for rr in records:
            if rr.rname == qname and (request.q.qtype in (rr.rtype, QTYPE.ANY)):
                reply.add_answer(rr)
        if not reply.rr:
            reply.header.rcode = RCODE.NXDOMAIN
        return reply


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--zone", required=True)
    a = ap.parse_args()
    resolver = ZoneFileResolver(a.zone)
    logger = DNSLogger(log="-request,-reply,-truncated,-error,-recv,-send,-data", prefix=False)
    servers = [
        DNSServer(resolver, port=a.port, address="127.0.0.1", logger=logger),
        DNSServer(resolver, port=a.port, address="127.0.0.1", tcp=True, logger=logger),
    ]
    for s in servers:
        s.start_thread()
    print("ready", flush=True)
    while all(s.isAlive() for s in servers):
        time.sleep(0.5)
    sys.exit(1)


if __name__ == "__main__":
    main()
