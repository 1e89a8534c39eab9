package fqdn

import (
	"container/list"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// A reply is learned only when it answers a query of the receiving pod
// that is still outstanding: same addresses and ports, same transaction
// ID, same question. The ruleset queues the pods' queries on the DNS queue
// too, so the one reader of that queue records each query before the
// query leaves the node, hence before its reply can be read. Without this,
// anything that gets a packet with the server's source address to the
// pod (a spoofing pod, a CNI without anti-spoofing) would be learned.

// Causes of replies released unlearned by query matching and stream
// tracking.
const (
	// CauseUnsolicited: no outstanding query of the pod matches the reply
	// (never asked, already answered, expired, or another question).
	CauseUnsolicited = "unsolicited"
	// CauseUntracked: a TCP reply on a connection whose stream is not
	// followed (opened before the agent started, or dropped from the
	// bounded table): where its messages start is unknown.
	CauseUntracked = "untracked_stream"
)

// DefaultQueryTimeout is how long a query waits for its reply. Stub
// resolvers give up far earlier (glibc after 5 s a try, Go's resolver
// after 5 s): a later reply is not read by the pod's resolver, so learning
// it would admit what nobody asked for anymore; a query past it is
// forgotten, its reply released unlearned.
const DefaultQueryTimeout = 10 * time.Second

// Bounds of the outstanding queries. A resolver asks a handful at once
// (A and AAAA, a few search domains); the bounds stop a pod that floods
// queries from growing the learner's memory, and only that pod's oldest
// queries are evicted (counted).
const (
	MaxQueriesPerPod = 256
	MaxQueries       = 1 << 16
)

// Question is a query's question: the name in lower case (DNS names
// compare case-insensitively, RFC 4343), its type and class.
type Question struct {
	Name        string
	Type, Class uint16
}

// ParseQuery returns a DNS query's ID and its one question. Messages that
// are responses, or carry no or several questions, are not queries a
// reply could be matched to.
func ParseQuery(msg []byte) (uint16, Question, bool) {
	return parseQuestion(msg, false)
}

// ReplyQuestion returns a DNS response's ID and its one question.
func ReplyQuestion(msg []byte) (uint16, Question, bool) {
	return parseQuestion(msg, true)
}

func parseQuestion(msg []byte, response bool) (uint16, Question, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil || h.Response != response || len(msg) < 12 || msg[4] != 0 || msg[5] != 1 {
		return 0, Question{}, false
	}
	q, err := p.Question()
	if err != nil {
		return 0, Question{}, false
	}
	return h.ID, Question{Name: strings.ToLower(q.Name.String()), Type: uint16(q.Type), Class: uint16(q.Class)}, true
}

// queryKey identifies an outstanding UDP query.
type queryKey struct {
	pod, server netip.AddrPort
	id          uint16
}

type pendingQuery struct {
	key     queryKey
	q       Question
	pod     string
	expires time.Time
}

// queryTable holds the outstanding UDP queries, per pod in arrival order
// (which is expiry order: the timeout is fixed). Not safe for concurrent
// use (tracker's lock).
type queryTable struct {
	m     map[queryKey]*list.Element
	byPod map[string]*list.List
	// swept is when expired queries of every pod were last dropped.
	swept time.Time
}

// add records a query, replacing one with the same key (a resolver's
// retransmission). It returns how many of the pod's queries it evicted.
func (t *queryTable) add(pq pendingQuery, now time.Time) (evicted int) {
	if t.m == nil {
		t.m, t.byPod = map[queryKey]*list.Element{}, map[string]*list.List{}
	}
	t.sweep(now)
	if e, ok := t.m[pq.key]; ok {
		t.remove(e)
	}
	l := t.byPod[pq.pod]
	if l == nil {
		l = list.New()
		t.byPod[pq.pod] = l
	}
	for l.Len() >= MaxQueriesPerPod || len(t.m) >= MaxQueries && l.Len() > 0 {
		t.remove(l.Front())
		evicted++
	}
	if len(t.m) >= MaxQueries {
		// Other pods fill the table: this pod's query is not kept.
		return evicted + 1
	}
	t.m[pq.key] = l.PushBack(&pq)
	return evicted
}

// take removes and returns the outstanding query a reply answers: the key
// matches, the query has not expired, the questions are equal. A reply
// with another question leaves the query outstanding.
func (t *queryTable) take(k queryKey, q Question, now time.Time) bool {
	e, ok := t.m[k]
	if !ok {
		return false
	}
	pq := e.Value.(*pendingQuery)
	if !now.Before(pq.expires) {
		t.remove(e)
		return false
	}
	if pq.q != q {
		return false
	}
	t.remove(e)
	return true
}

// has reports whether a query with key k is outstanding.
func (t *queryTable) has(k queryKey) bool { _, ok := t.m[k]; return ok }

func (t *queryTable) remove(e *list.Element) {
	pq := e.Value.(*pendingQuery)
	delete(t.m, pq.key)
	l := t.byPod[pq.pod]
	l.Remove(e)
	if l.Len() == 0 {
		delete(t.byPod, pq.pod)
	}
}

// sweep drops expired queries, at most once a second: each pod's list is
// in expiry order, so this costs the expired queries and one look per pod.
func (t *queryTable) sweep(now time.Time) {
	if now.Sub(t.swept) < time.Second {
		return
	}
	t.swept = now
	for _, l := range t.byPod {
		for l.Len() > 0 {
			e := l.Front()
			if now.Before(e.Value.(*pendingQuery).expires) {
				break
			}
			t.remove(e)
		}
	}
}

// len returns the number of outstanding queries.
func (t *queryTable) len() int { return len(t.m) }
