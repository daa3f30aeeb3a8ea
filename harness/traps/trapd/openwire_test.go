package main

import (
	"encoding/binary"
	"math/rand"
	"reflect"
	"testing"
)

// owEnc writes one command as activemq-client would: tight (booleans in a leading bit stream) or
// loose, with or without the cache. Only the fields the reader decodes are written in full; the
// rest of a message is opaque bytes after them.
type owEnc struct {
	tight, cache bool
	bits         []bool
	data         []byte
	index        map[string]int16 // the cache: key -> index, as the marshaller keeps it
}

func (e *owEnc) boolean(v bool) {
	if e.tight {
		e.bits = append(e.bits, v)
		return
	}
	if v {
		e.data = append(e.data, 1)
	} else {
		e.data = append(e.data, 0)
	}
}

func (e *owEnc) long(v int64) {
	if !e.tight {
		e.data = binary.BigEndian.AppendUint64(e.data, uint64(v))
		return
	}
	switch {
	case v == 0:
		e.boolean(false)
		e.boolean(false)
	case v < 1<<16:
		e.boolean(false)
		e.boolean(true)
		e.data = binary.BigEndian.AppendUint16(e.data, uint16(v))
	case v < 1<<32:
		e.boolean(true)
		e.boolean(false)
		e.data = binary.BigEndian.AppendUint32(e.data, uint32(v))
	default:
		e.boolean(true)
		e.boolean(true)
		e.data = binary.BigEndian.AppendUint64(e.data, uint64(v))
	}
}

func (e *owEnc) str(s string) {
	e.boolean(true)
	if e.tight {
		e.boolean(true) // ASCII
	}
	e.data = binary.BigEndian.AppendUint16(e.data, uint16(len(s)))
	e.data = append(e.data, s...)
}

// cached writes a structure through the cache; body writes its type and fields (nil: a null,
// which the marshaller caches as it does any other value).
func (e *owEnc) cached(key string, body func()) {
	if !e.cache {
		e.boolean(body != nil)
		if body != nil {
			body()
		}
		return
	}
	idx, seen := e.index[key]
	e.boolean(!seen)
	if seen {
		e.data = binary.BigEndian.AppendUint16(e.data, uint16(idx))
		return
	}
	idx = int16(len(e.index))
	e.index[key] = idx
	e.data = binary.BigEndian.AppendUint16(e.data, uint16(idx))
	e.boolean(body != nil)
	if body != nil {
		body()
	}
}

func (e *owEnc) connection(id string) {
	e.cached("c:"+id, func() { e.data = append(e.data, 120); e.str(id) })
}

func (e *owEnc) consumer(conn string, value int64) {
	e.cached("k:"+conn, func() { e.data = append(e.data, 122); e.str(conn); e.long(1); e.long(value) })
}

func (e *owEnc) tx(conn string, value int64) {
	e.cached("tx:"+conn+string(rune(value)), func() { e.data = append(e.data, 111); e.long(value); e.connection(conn) })
}

func (e *owEnc) producer(conn string) {
	e.cached("p:"+conn, func() { e.data = append(e.data, 123); e.str(conn); e.long(1); e.long(1) })
}

// messageID writes a MessageId (nested): no text view, its producer, its sequence numbers.
func (e *owEnc) messageID(conn string, seq int64) {
	e.boolean(true)
	e.data = append(e.data, 110)
	e.boolean(false) // text view
	e.producer(conn)
	e.long(seq)
	e.long(1000 + seq)
}

// dispatch writes a MessageDispatch's fields: the consumer, the destination, the message's head
// (as a nested, marshal-aware structure) and then its body.
func (e *owEnc) dispatch(conn, producerConn string, seq int64, body string) {
	e.consumer(conn, 1)
	e.queue("in")
	e.boolean(true)
	e.data = append(e.data, 28)
	if e.tight {
		e.boolean(false) // no cached marshalled form
	}
	e.data = binary.BigEndian.AppendUint32(e.data, 0) // the message's command id
	e.boolean(false)                                  // responseRequired
	e.producer(producerConn)
	e.queue("in")
	e.cached("null", nil) // transaction
	e.cached("null", nil) // original destination
	e.messageID(producerConn, seq)
	e.data = append(e.data, body...)
}

// ack writes a MessageAck's fields.
func (e *owEnc) ack(conn string, tx int64, ackType byte, producerConn string, first, last int64) {
	e.queue("in")
	if tx == 0 {
		e.cached("null", nil)
	} else {
		e.tx(conn, tx)
	}
	e.consumer(conn, 1)
	e.data = append(e.data, ackType)
	e.messageID(producerConn, first)
	e.messageID(producerConn, last)
	e.data = binary.BigEndian.AppendUint32(e.data, uint32(last-first+1))
	e.boolean(false) // no poison cause
}

func (e *owEnc) queue(name string) {
	e.cached("d:"+name, func() { e.data = append(e.data, 100); e.str(name) })
}

// command frames the fields written by fill as command kind with id.
func (e *owEnc) command(kind byte, id int32, fill func()) []byte {
	e.bits, e.data = nil, binary.BigEndian.AppendUint32(nil, uint32(id))
	if !e.tight {
		e.data = append(e.data, 1) // responseRequired
	} else {
		e.bits = append(e.bits, true)
	}
	fill()
	body := []byte{kind}
	if e.tight {
		stream := make([]byte, (len(e.bits)+7)/8)
		for i, b := range e.bits {
			if b {
				stream[i/8] |= 1 << (i % 8)
			}
		}
		body = append(append(body, byte(len(stream))), stream...)
	}
	body = append(body, e.data...)
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

func owWireFormatFrame(tight, cache bool) []byte {
	flag := func(name string, v bool) []byte {
		b := append([]byte{0, byte(len(name))}, name...)
		if v {
			return append(b, 1, 1)
		}
		return append(b, 1, 0)
	}
	body := append([]byte{owWireFormatInfo}, "ActiveMQ\x00\x00\x00\x0c"...)
	body = append(body, flag("TightEncodingEnabled", tight)...)
	body = append(body, flag("CacheEnabled", cache)...)
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

type owStep struct {
	up   bool
	data []byte
}

// owConversation is a transacted JMS receive-and-send as activemq-client runs it: a dispatch, the
// delivered-ack at receive, a send in the transaction, the standard ack and the commit at
// session.commit(), and the broker's response to the commit.
func owConversation(tight, cache bool) []owStep {
	client := &owEnc{tight: tight, cache: cache, index: map[string]int16{}}
	broker := &owEnc{tight: tight, cache: cache, index: map[string]int16{}}
	conn := "ID:host-1"
	return []owStep{
		{true, owWireFormatFrame(true, true)},
		{false, owWireFormatFrame(tight, cache)},
		// The client names its consumer first in its ConsumerInfo: its acks then name it by index.
		{true, client.command(5, 1, func() {
			client.consumer(conn, 1)
			client.data = append(client.data, "...the rest of the ConsumerInfo..."...)
		})},
		{false, broker.command(owMessageDispatch, 0, func() { broker.dispatch(conn, "ID:other", 1, `{"op": "op-7", "amount": 3}`) })},
		{true, client.command(owMessageAck, 5, func() { client.ack(conn, 0, 0, "ID:other", 1, 1) })}, // delivered-ack
		// The delivered-ack let the broker send the next message before this one is consumed.
		{false, broker.command(owMessageDispatch, 0, func() { broker.dispatch(conn, "ID:other", 2, `{"op": "op-8"}`) })},
		{true, client.command(28, 6, func() {
			client.producer(conn)
			client.queue("out")
			client.tx(conn, 9)
			client.data = append(client.data, `{"op": "op-7"}`...)
		})},
		{true, client.command(owMessageAck, 7, func() { client.ack(conn, 9, owAckStandard, "ID:other", 1, 1) })},
		{true, client.command(owTransactionInfo, 42, func() {
			client.connection(conn)
			client.tx(conn, 9)
			client.data = append(client.data, owCommitOnePhase)
		})},
		{false, broker.command(owResponse, 3, func() { broker.data = binary.BigEndian.AppendUint32(broker.data, 42) })},
	}
}

func owSession0(armed ...string) *owSession {
	return NewOpenWireSession(NewFinder(func() []string { return armed }, nil)).(*owSession)
}

// owRun feeds the steps, each split into chunks of at most chunk bytes, and returns the hits' points and ops.
func owRun(s *owSession, steps []owStep, chunk func(int) int) []string {
	var got []string
	for _, st := range steps {
		for i := 0; i < len(st.data); {
			n := min(chunk(len(st.data)-i), len(st.data)-i)
			_, hits := s.Feed(st.up, st.data[i:i+n])
			for _, h := range hits {
				got = append(got, h.Point+" "+joinOps(h.Ops))
			}
			i += n
		}
	}
	return got
}

func joinOps(ops []string) string {
	out := ""
	for _, op := range ops {
		out += "[" + op + "]"
	}
	return out
}

var owWant = []string{
	"openwire_before_ack [op-7]",
	"openwire_before_commit [op-7]",
	"openwire_after_commit [op-7]",
}

func TestOpenWireCommitAndAckCarryTheOpsOfTheTransaction(t *testing.T) {
	for _, enc := range []struct{ tight, cache bool }{{true, true}, {true, false}, {false, true}, {false, false}} {
		got := owRun(owSession0("op-7"), owConversation(enc.tight, enc.cache), func(n int) int { return n })
		if !reflect.DeepEqual(got, owWant) {
			t.Errorf("tight=%v cache=%v: hits %v, want %v", enc.tight, enc.cache, got, owWant)
		}
	}
}

func TestOpenWireCommandsSplitAnywhereReadAsWhole(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for round := 0; round < 200; round++ {
		got := owRun(owSession0("op-7"), owConversation(true, true), func(int) int { return 1 + rng.Intn(9) })
		if !reflect.DeepEqual(got, owWant) {
			t.Fatalf("round %d: hits %v, want %v", round, got, owWant)
		}
	}
}

func TestOpenWireHitsStartAtTheirCommand(t *testing.T) {
	steps := owConversation(true, true)
	s := owSession0("op-7")
	var joined []byte
	for _, st := range steps[:8] {
		s.Feed(st.up, st.data)
	}
	joined = append(append(joined, 0, 0, 0, 1, 10), steps[8].data...) // a KeepAliveInfo, then the commit
	_, hits := s.Feed(true, joined)
	if len(hits) != 1 || hits[0].Offset != 5 {
		t.Fatalf("the commit after a 5-byte command should hit at offset 5: %+v", hits)
	}
}

func TestOpenWireARollbackForgetsItsSends(t *testing.T) {
	client := &owEnc{tight: true, cache: true, index: map[string]int16{}}
	s := owSession0("op-1")
	s.Feed(true, owWireFormatFrame(true, true))
	s.Feed(false, owWireFormatFrame(true, true))
	s.Feed(true, client.command(28, 1, func() {
		client.producer("c")
		client.queue("out")
		client.tx("c", 1)
		client.data = append(client.data, "op-1"...)
	}))
	s.Feed(true, client.command(owTransactionInfo, 2, func() { client.connection("c"); client.tx("c", 1); client.data = append(client.data, owRollback) }))
	_, hits := s.Feed(true, client.command(owTransactionInfo, 3, func() {
		client.connection("c")
		client.tx("c", 1)
		client.data = append(client.data, owCommitOnePhase)
	}))
	if len(hits) != 1 || len(hits[0].Ops) != 0 {
		t.Fatalf("a commit after a rollback carries no op of the rolled-back send: %+v", hits)
	}
}

func TestOpenWireAFailedCommitIsNotConfirmed(t *testing.T) {
	steps := owConversation(true, true)
	broker := &owEnc{tight: true, cache: true, index: map[string]int16{}}
	steps[len(steps)-1].data = broker.command(owExceptionResp, 3, func() { broker.data = binary.BigEndian.AppendUint32(broker.data, 42) })
	got := owRun(owSession0("op-7"), steps, func(n int) int { return n })
	if !reflect.DeepEqual(got, owWant[:2]) {
		t.Fatalf("an ExceptionResponse to a commit is no after-commit: %v", got)
	}
}

func TestOpenWireABigMessageIsNotKeptWhole(t *testing.T) {
	s := owSession0()
	s.Feed(true, owWireFormatFrame(true, true))
	s.Feed(false, owWireFormatFrame(true, true))
	big := append(binary.BigEndian.AppendUint32(nil, 4_000_001), owMessageDispatch)
	big = append(big, make([]byte, 4_000_000)...)
	for i := 0; i < len(big); i += 65536 {
		s.Feed(false, big[i:min(i+65536, len(big))])
		if len(s.down.body) > owFrameCap {
			t.Fatalf("a dispatch was kept beyond the cap: %d bytes", len(s.down.body))
		}
	}
	got := owRun(s, owConversation(true, true)[2:], func(n int) int { return n })
	if len(got) != 3 {
		t.Fatalf("the conversation after a big dispatch was not read: %v", got)
	}
}

func TestOpenWireAnAckNamingItsConsumerByIndexFindsItsMessages(t *testing.T) {
	steps := owConversation(true, true)
	without := append(append([]owStep{}, steps[:2]...), steps[3:]...) // no ConsumerInfo: the index is unknown
	if got := owRun(owSession0("op-7"), without, func(n int) int { return n }); reflect.DeepEqual(got, owWant) {
		t.Fatalf("the test does not depend on the ConsumerInfo: %v", got)
	}
	got := owRun(owSession0("op-7"), steps, func(n int) int { return n })
	if len(got) != 3 {
		t.Fatalf("the conversation after a big dispatch was not read: %v", got)
	}
}

// FuzzOpenWire: no input makes the reader panic, and every byte fed is forwarded unchanged.
func FuzzOpenWire(f *testing.F) {
	for _, st := range owConversation(true, true) {
		f.Add(st.data, st.up)
	}
	f.Add([]byte{0, 0, 0, 3, 22, 0xC0, 0xFF}, true)
	f.Add([]byte{0, 0, 0, 2, 30, 0x80}, false)
	f.Fuzz(func(t *testing.T, data []byte, up bool) {
		s := owSession0("op-7")
		s.Feed(true, owWireFormatFrame(true, true))
		s.Feed(false, owWireFormatFrame(true, true))
		out, _ := s.Feed(up, data)
		if !reflect.DeepEqual(out, data) {
			t.Fatalf("the reader changed the bytes it forwards")
		}
		s.Feed(!up, data)
	})
}
