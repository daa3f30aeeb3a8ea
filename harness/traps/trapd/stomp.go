// STOMP 1.0-1.2, read frame by frame to see an ACK or COMMIT sent and a COMMIT's RECEIPT.
//
// A frame is a command line, header lines, a blank line, a body and a NUL (the body's length is
// content-length when given, so a body may hold NULs). Heart-beats are bare end-of-lines between
// frames. Headers are kept whole (they are small); a body only up to stompBodyCap and only for
// SEND and MESSAGE frames, the two whose op ids matter.
//
// Ops: a MESSAGE's op is its txchaos-op header, else the op ids found in its headers and body; an
// ACK carries the ops of the message it acknowledges (by id = the MESSAGE's ack in 1.2, by
// message-id before); a COMMIT carries the ops of the SENDs and ACKs of its transaction. The
// RECEIPT of a COMMIT is seen only when the client asked for one (a receipt header on COMMIT).
package main

import (
	"bytes"
	"container/list"
	"strconv"
)

const (
	stompBodyCap     = 64 * 1024
	stompMessagesCap = 100_000 // unacknowledged MESSAGE ops remembered per connection (oldest dropped first)
)

type stompFrame struct {
	offset  int
	command string
	headers map[string]string
	body    []byte
}

// stompFramer splits one direction into frames without holding whole bodies.
type stompFramer struct {
	head      []byte
	inHead    bool
	inBody    bool
	remaining int // content-length left, or -1: read to the NUL
	body      []byte
	command   string
	headers   map[string]string
	keep      bool
	start     int
}

func (f *stompFramer) feed(data []byte) []stompFrame {
	var out []stompFrame
	i, n := 0, len(data)
	f.start = 0
	for i < n {
		if f.inBody {
			if f.remaining > 0 {
				take := min(f.remaining, n-i)
				f.keepBody(data[i : i+take])
				i += take
				f.remaining -= take
				continue
			}
			end := bytes.IndexByte(data[i:], 0)
			if end < 0 {
				if f.remaining < 0 {
					f.keepBody(data[i:])
				}
				break
			}
			if f.remaining < 0 {
				f.keepBody(data[i : i+end])
			}
			i += end + 1
			out = append(out, stompFrame{f.start, f.command, f.headers, f.body})
			f.inBody, f.body = false, nil
			continue
		}
		if !f.inHead {
			for i < n && (data[i] == '\r' || data[i] == '\n') {
				i++ // heart-beats between frames
			}
			if i == n {
				break
			}
			f.start, f.inHead = i, true
		}
		if len(f.head) == 0 { // the common case: the whole header block is in this chunk
			if cut, sep := stompBlankLine(data[i:], 0); cut >= 0 {
				f.beginBody(data[i : i+cut])
				i += cut + sep
				f.inHead = false
				continue
			}
		}
		seen := len(f.head)
		f.head = append(f.head, data[i:]...) // a header block split across chunks: kept until its blank line
		cut, sep := stompBlankLine(f.head, max(0, seen-2))
		if cut < 0 {
			break
		}
		i += cut + sep - seen
		f.beginBody(f.head[:cut])
		f.head = f.head[:0]
		f.inHead = false
	}
	return out
}

func (f *stompFramer) beginBody(head []byte) {
	text := bytes.ReplaceAll(bytes.TrimRight(head, "\r"), []byte("\r\n"), []byte("\n"))
	lines := bytes.Split(text, []byte("\n"))
	f.command = string(bytes.TrimSpace(lines[0]))
	headers := map[string]string{}
	for _, line := range lines[1:] {
		key, value, _ := bytes.Cut(line, []byte(":"))
		if _, seen := headers[string(key)]; !seen {
			headers[string(key)] = string(value) // the first of a repeated header wins (STOMP 1.2)
		}
	}
	f.headers = headers
	f.keep = f.command == "SEND" || f.command == "MESSAGE"
	f.remaining = -1
	if length, err := strconv.Atoi(string(bytes.TrimSpace([]byte(headers["content-length"])))); err == nil && length >= 0 {
		f.remaining = length
	}
	f.inBody = true
	f.body = nil
}

func (f *stompFramer) keepBody(chunk []byte) {
	if f.keep && len(f.body) < stompBodyCap {
		f.body = append(f.body, chunk[:min(len(chunk), stompBodyCap-len(f.body))]...)
	}
}

// stompBlankLine returns where the header block ends in buf (searched from start) and the length
// of the blank line after it ("\n\n" or "\n\r\n"), or -1; it reads no further than that line.
func stompBlankLine(buf []byte, start int) (int, int) {
	for k := start; k < len(buf); {
		j := bytes.IndexByte(buf[k:], '\n')
		if j < 0 {
			return -1, 0
		}
		p := k + j
		if p+1 < len(buf) && buf[p+1] == '\n' {
			return p, 2
		}
		if p+2 < len(buf) && buf[p+1] == '\r' && buf[p+2] == '\n' {
			return p, 3
		}
		k = p + 1
	}
	return -1, 0
}

type stompMessage struct {
	key string
	ops []string
}

// stompSession is the protocol state of one STOMP connection: delivered messages, open transactions, receipts.
type stompSession struct {
	guarded
	find     Finder
	up       stompFramer
	down     stompFramer
	messages map[string]*list.Element // key -> element holding a stompMessage, oldest first in order
	order    *list.List
	txns     map[string]opSet
	receipts map[string][]string
}

// NewStompSession returns the reader of one STOMP connection.
func NewStompSession(find Finder) Session {
	return &stompSession{
		find: find, messages: map[string]*list.Element{}, order: list.New(),
		txns: map[string]opSet{}, receipts: map[string][]string{},
	}
}

func (s *stompSession) Feed(up bool, data []byte) ([]byte, []Hit) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if up {
		return data, s.readUp(data)
	}
	return data, s.readDown(data)
}

func (s *stompSession) ops(headers map[string]string, body []byte) []string {
	if tagged := headers["txchaos-op"]; tagged != "" {
		return []string{tagged}
	}
	var text []byte
	for _, v := range headers {
		text = append(append(text, v...), '\n')
	}
	return s.find(append(append(text, '\n'), body...))
}

func (s *stompSession) txn(name string) opSet {
	set, ok := s.txns[name]
	if !ok {
		set = opSet{}
		s.txns[name] = set
	}
	return set
}

func (s *stompSession) readUp(data []byte) []Hit {
	var hits []Hit
	for _, f := range s.up.feed(data) {
		tx, inTx := f.headers["transaction"]
		switch {
		case f.command == "SEND" && inTx:
			s.txn(tx).add(s.ops(f.headers, f.body)...)
		case f.command == "ACK":
			key := f.headers["id"]
			if key == "" {
				key = f.headers["message-id"]
			}
			ops := s.take(key)
			if inTx {
				s.txn(tx).add(ops...)
			}
			hits = append(hits, Hit{"stomp_before_ack", f.offset, nonNil(ops)})
		case f.command == "COMMIT" && inTx:
			ops := s.txn(tx).sorted()
			delete(s.txns, tx)
			if receipt, ok := f.headers["receipt"]; ok {
				s.receipts[receipt] = ops
			}
			hits = append(hits, Hit{"stomp_before_commit", f.offset, ops})
		case f.command == "ABORT" && inTx:
			delete(s.txns, tx)
		}
	}
	return hits
}

func (s *stompSession) readDown(data []byte) []Hit {
	var hits []Hit
	for _, f := range s.down.feed(data) {
		switch f.command {
		case "MESSAGE":
			ops := uniqueSorted(s.ops(f.headers, f.body))
			for _, name := range []string{"ack", "message-id"} {
				if key, ok := f.headers[name]; ok {
					s.remember(key, ops)
				}
			}
			for s.order.Len() > stompMessagesCap {
				oldest := s.order.Front()
				delete(s.messages, oldest.Value.(stompMessage).key)
				s.order.Remove(oldest)
			}
		case "RECEIPT":
			if ops, ok := s.receipts[f.headers["receipt-id"]]; ok {
				delete(s.receipts, f.headers["receipt-id"])
				hits = append(hits, Hit{"stomp_after_commit", f.offset, ops})
			}
		}
	}
	return hits
}

func (s *stompSession) remember(key string, ops []string) {
	if old, ok := s.messages[key]; ok {
		old.Value = stompMessage{key, ops} // a key seen again keeps its place, as an ordered dict does
		return
	}
	s.messages[key] = s.order.PushBack(stompMessage{key, ops})
}

func (s *stompSession) take(key string) []string {
	e, ok := s.messages[key]
	if !ok {
		return nil
	}
	delete(s.messages, key)
	s.order.Remove(e)
	return e.Value.(stompMessage).ops
}

func nonNil(ops []string) []string {
	if ops == nil {
		return []string{}
	}
	return ops
}
