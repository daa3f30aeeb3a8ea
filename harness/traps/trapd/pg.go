// The Postgres wire protocol v3, read just far enough to see a COMMIT sent and a COMMIT confirmed.
//
// Client to server: the untyped startup packets (an SSLRequest or GSSENCRequest is answered by one
// byte: 'N' goes on in clear; 'S'/'G' means TLS, unreadable here, so the connection is passed
// through untouched), then typed messages, of which only Q (simple query) and P/B/E (Parse, Bind,
// Execute) are read; every other message is skipped by its length, so a session is never buffered
// whole. Server to client: C (CommandComplete, tag COMMIT or ROLLBACK) and Z (ReadyForQuery,
// status I: out of any transaction). A transaction's text (statements and bound parameters since
// the last Z I or COMMIT) is kept up to pgTxnCap to recognise the op ids a COMMIT commits.
package main

import (
	"bytes"
	"encoding/binary"
)

const (
	pgTxnCap      = 256 * 1024 // a transaction's text beyond this is not searched for op ids
	pgSSLRequest  = 80877103
	pgGSSENCReq   = 80877104
	pgStartup     = -1 // the message type of an untyped startup packet
	pgReply       = -2 // the one-byte answer to an SSLRequest / GSSENCRequest
	pgHeadTyped   = 5
	pgHeadUntyped = 4
)

// pgIsCommit tells whether a query string holds a COMMIT (or END) statement; COMMIT PREPARED is not one.
func pgIsCommit(query []byte) bool {
	for _, stmt := range bytes.Split(pgStripComments(query), []byte(";")) {
		words := bytes.Fields(stmt)
		if len(words) == 0 {
			continue
		}
		first := bytes.ToLower(words[0])
		if !bytes.Equal(first, []byte("commit")) && !bytes.Equal(first, []byte("end")) {
			continue
		}
		if len(words) > 1 && bytes.EqualFold(words[1], []byte("prepared")) {
			continue
		}
		return true
	}
	return false
}

// pgStripComments blanks -- line comments and /* block */ comments (as the server would skip them).
func pgStripComments(q []byte) []byte {
	if !bytes.Contains(q, []byte("--")) && !bytes.Contains(q, []byte("/*")) {
		return q
	}
	out := make([]byte, 0, len(q))
	for i := 0; i < len(q); {
		switch {
		case q[i] == '-' && i+1 < len(q) && q[i+1] == '-':
			end := bytes.IndexByte(q[i:], '\n')
			if end < 0 {
				i = len(q)
			} else {
				i += end
			}
			out = append(out, ' ')
		case q[i] == '/' && i+1 < len(q) && q[i+1] == '*':
			end := bytes.Index(q[i+2:], []byte("*/"))
			if end < 0 {
				out = append(out, q[i:]...) // an unclosed comment stays, as the regexp left it
				i = len(q)
			} else {
				i += 2 + end + 2
				out = append(out, ' ')
			}
		default:
			out = append(out, q[i])
			i++
		}
	}
	return out
}

type pgMessage struct {
	offset int
	kind   int
	body   []byte
}

// pgFramer splits one direction into messages without buffering the bodies nobody reads.
type pgFramer struct {
	keep    map[int]bool
	startup bool
	replies int // one-byte answers expected before the next typed message
	head    []byte
	body    []byte
	need    int
	kind    int
	keeping bool
	start   int
}

func (f *pgFramer) feed(data []byte) []pgMessage {
	var out []pgMessage
	i, n := 0, len(data)
	f.start = 0 // a message begun in an earlier chunk is held from this chunk's start
	for i < n {
		if f.need > 0 {
			take := min(f.need, n-i)
			if f.keeping {
				f.body = append(f.body, data[i:i+take]...)
			}
			i += take
			f.need -= take
			if f.need == 0 {
				out = append(out, f.done())
			}
			continue
		}
		if f.replies > 0 && len(f.head) == 0 {
			out = append(out, pgMessage{i, pgReply, []byte{data[i]}})
			f.replies--
			i++
			continue
		}
		if len(f.head) == 0 {
			f.start = i
		}
		size := pgHeadTyped
		if f.startup {
			size = pgHeadUntyped
		}
		take := min(size-len(f.head), n-i)
		f.head = append(f.head, data[i:i+take]...)
		i += take
		if len(f.head) < size {
			break
		}
		var length int
		if f.startup {
			f.kind, length = pgStartup, int(binary.BigEndian.Uint32(f.head))
		} else {
			f.kind, length = int(f.head[0]), int(binary.BigEndian.Uint32(f.head[1:]))
		}
		f.head = f.head[:0]
		f.need = max(0, length-4)
		f.keeping = f.keep[f.kind] || f.kind == pgStartup
		if f.need == 0 {
			out = append(out, f.done())
		}
	}
	return out
}

func (f *pgFramer) done() pgMessage {
	body := f.body
	f.body = nil
	if f.kind == pgStartup && !pgStaysUntyped(body) {
		f.startup = false // at once: the typed messages may follow in this very chunk
	}
	return pgMessage{f.start, f.kind, body}
}

func pgStaysUntyped(body []byte) bool {
	if len(body) < 4 {
		return false
	}
	code := binary.BigEndian.Uint32(body)
	return code == pgSSLRequest || code == pgGSSENCReq // a StartupMessage follows
}

func pgCString(body []byte, at int) ([]byte, int) {
	if at > len(body) {
		return nil, len(body) + 1
	}
	end := bytes.IndexByte(body[at:], 0)
	if end < 0 {
		return body[at:], len(body) + 1
	}
	return body[at : at+end], at + end + 1
}

// pgSession is the protocol state of one Postgres connection: its open transaction and the COMMITs in flight.
type pgSession struct {
	guarded
	find          Finder
	up            pgFramer
	down          pgFramer
	txn           []byte
	commitStmts   map[string]bool
	commitPortals map[string]bool
	pending       [][]string // ops of each COMMIT sent, awaiting its tag
	opaque        bool       // TLS was negotiated: nothing more can be read
}

// NewPgSession returns the reader of one Postgres connection.
func NewPgSession(find Finder) Session {
	return &pgSession{
		find:          find,
		up:            pgFramer{keep: map[int]bool{'Q': true, 'P': true, 'B': true, 'E': true}, startup: true},
		down:          pgFramer{keep: map[int]bool{'C': true, 'Z': true}},
		commitStmts:   map[string]bool{},
		commitPortals: map[string]bool{},
	}
}

func (s *pgSession) Feed(up bool, data []byte) ([]byte, []Hit) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opaque {
		return data, nil
	}
	if up {
		return data, s.readUp(data)
	}
	return data, s.readDown(data)
}

func (s *pgSession) readUp(data []byte) []Hit {
	var hits []Hit
	for _, m := range s.up.feed(data) {
		switch m.kind {
		case pgStartup:
			if pgStaysUntyped(m.body) {
				s.down.replies++
			}
		case 'Q':
			query, _ := pgCString(m.body, 0)
			s.remember(query)
			if pgIsCommit(query) {
				hits = append(hits, s.commit(m.offset))
			}
		case 'P':
			name, at := pgCString(m.body, 0)
			query, _ := pgCString(m.body, at)
			pgMark(s.commitStmts, string(name), pgIsCommit(query))
			s.remember(query)
		case 'B':
			portal, at := pgCString(m.body, 0)
			stmt, _ := pgCString(m.body, at)
			pgMark(s.commitPortals, string(portal), s.commitStmts[string(stmt)])
			s.remember(m.body) // the bound parameters, raw: text or binary, op ids are found as bytes
		case 'E':
			portal, _ := pgCString(m.body, 0)
			if s.commitPortals[string(portal)] {
				hits = append(hits, s.commit(m.offset))
			}
		}
	}
	return hits
}

func (s *pgSession) readDown(data []byte) []Hit {
	var hits []Hit
	for _, m := range s.down.feed(data) {
		switch m.kind {
		case pgReply:
			s.opaque = len(m.body) != 1 || m.body[0] != 'N'
		case 'C':
			tag, _ := pgCString(m.body, 0)
			if len(s.pending) > 0 && bytes.HasPrefix(tag, []byte("COMMIT")) {
				hits = append(hits, Hit{"pg_after_commit", m.offset, s.pending[0]})
				s.pending = s.pending[1:]
			} else if len(s.pending) > 0 && bytes.HasPrefix(tag, []byte("ROLLBACK")) {
				s.pending = s.pending[1:] // a COMMIT of a failed transaction rolls back: nothing committed
			}
		case 'Z':
			s.pending = nil // a COMMIT that failed answered with an error before this
			if len(m.body) > 0 && m.body[0] == 'I' {
				s.txn = s.txn[:0]
			}
		}
	}
	return hits
}

func (s *pgSession) remember(text []byte) {
	if room := pgTxnCap - len(s.txn); room > 0 {
		s.txn = append(s.txn, text[:min(room, len(text))]...)
	}
}

func (s *pgSession) commit(offset int) Hit {
	ops := s.find(s.txn)
	if ops == nil {
		ops = []string{}
	}
	s.txn = s.txn[:0]
	s.pending = append(s.pending, ops)
	return Hit{"pg_before_commit", offset, ops}
}

// pgMark keeps name in set when on, and forgets it otherwise (so the set holds only COMMITs).
func pgMark(set map[string]bool, name string, on bool) {
	if on {
		set[name] = true
	} else {
		delete(set, name)
	}
}
