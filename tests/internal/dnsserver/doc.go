// Package dnsserver is a small authoritative DNS server for tests: it
// answers A, AAAA and TXT questions over UDP and TCP from a fixed table of
// names, CNAMEs and TTLs, can mark chosen names' answers truncated and can
// write chosen names' TCP answers in small segments. It
// listens in whatever network namespace its sockets are created in (a
// netlab namespace of its own, playing the cluster DNS). Lookup is the
// matching client. Messages are built and parsed with
// golang.org/x/net/dns/dnsmessage.
package dnsserver
