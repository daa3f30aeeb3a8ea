// OpenWire (ActiveMQ Classic's native protocol, what activemq-client and Mats3 speak), read just
// far enough to see a JMS transaction's commit sent and confirmed, and a message acknowledged.
//
// A connection is a stream of commands, each an int size and that many bytes: the command type,
// then its fields. Both sides first send a WireFormatInfo (always loose-encoded); from the next
// command on, each side speaks the negotiated format: tight encoding (a bit stream of the
// command's booleans ahead of its fields, longs in 0/2/4/8 bytes) when both ask for it, and the
// cache (a repeated id or destination sent as a 2-byte index) when both enable it. activemq-client
// asks for both by default. The reader decodes only the leading fields it needs: the ids a command
// names (consumer, transaction) and, for a TransactionInfo, its type; every other command is
// skipped by its size. A command it cannot decode is passed on as it came, with no hit.
//
// Hits: openwire_before_ack on a MessageAck that consumes (standard, individual or poison: not the
// delivered-ack the client sends as it receives), with the ops of the messages it consumes: those
// dispatched to that consumer up to the ack's last message id (a standard ack), or that one; openwire_before_commit on a TransactionInfo commit, with the
// ops of the messages sent and acknowledged in that transaction; openwire_after_commit on the
// broker's Response to that commit. A message's ops are the op ids found in its bytes (body and
// properties).
package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

const (
	owFrameCap   = 256 * 1024 // a command's bytes beyond this are not searched for op ids
	owPendingCap = 10_000     // consumers, transactions and commits remembered per connection

	owWireFormatInfo  = 1
	owTransactionInfo = 7
	owMessageDispatch = 21
	owMessageAck      = 22
	owFirstMessage    = 23 // ActiveMQMessage .. ActiveMQBlobMessage: 23..29
	owLastMessage     = 29
	owResponse        = 30
	owExceptionResp   = 31

	owCommitOnePhase = 2
	owCommitTwoPhase = 3
	owRollback       = 4

	owAckPoison     = 1
	owAckStandard   = 2
	owAckIndividual = 4
)

var errOwShort = errors.New("openwire: command shorter than its fields")

// owIntroduces: the commands whose first field is the (cached) id they make: ConnectionInfo,
// SessionInfo, ConsumerInfo, ProducerInfo, DestinationInfo (its connection), RemoveInfo.
var owIntroduces = map[byte]bool{3: true, 4: true, 5: true, 6: true, 8: true, 12: true}

// owFormat is what one direction negotiated.
type owFormat struct {
	negotiated bool
	tight      bool
	cache      bool
}

// owFramer reassembles one direction's commands, keeping at most owFrameCap bytes of each.
type owFramer struct {
	head      []byte // the 4-byte size, while incomplete
	remaining int    // bytes of the current command still to come; 0 between commands
	body      []byte
	start     int // where the current command began in this chunk (0: in an earlier one)
}

type owCommand struct {
	offset int
	body   []byte // the command, its type first, up to owFrameCap bytes
}

func (f *owFramer) feed(data []byte) []owCommand {
	var out []owCommand
	f.start = 0
	for i := 0; i < len(data); {
		if f.remaining == 0 {
			if len(f.head) == 0 {
				f.start = i
			}
			take := min(4-len(f.head), len(data)-i)
			f.head = append(f.head, data[i:i+take]...)
			i += take
			if len(f.head) < 4 {
				break
			}
			f.remaining = int(binary.BigEndian.Uint32(f.head))
			f.head = f.head[:0]
			f.body = make([]byte, 0, min(f.remaining, owFrameCap))
			continue
		}
		take := min(f.remaining, len(data)-i)
		if keep := owFrameCap - len(f.body); keep > 0 {
			f.body = append(f.body, data[i:i+min(take, keep)]...)
		}
		i += take
		f.remaining -= take
		if f.remaining == 0 {
			out = append(out, owCommand{f.start, f.body})
			f.body = nil
		}
	}
	return out
}

// owReader decodes the fields of one command.
type owReader struct {
	buf   []byte
	pos   int
	tight bool
	cache bool
	bits  []byte // tight: the command's boolean stream
	bit   int
	seen  map[int16]string // this direction's cache: index -> key of the object sent there
}

func (r *owReader) need(n int) error {
	if n < 0 || r.pos+n > len(r.buf) {
		return errOwShort
	}
	return nil
}

func (r *owReader) byte1() (byte, error) {
	if err := r.need(1); err != nil {
		return 0, err
	}
	r.pos++
	return r.buf[r.pos-1], nil
}

func (r *owReader) int16() (int16, error) {
	if err := r.need(2); err != nil {
		return 0, err
	}
	r.pos += 2
	return int16(binary.BigEndian.Uint16(r.buf[r.pos-2:])), nil
}

func (r *owReader) int32() (int32, error) {
	if err := r.need(4); err != nil {
		return 0, err
	}
	r.pos += 4
	return int32(binary.BigEndian.Uint32(r.buf[r.pos-4:])), nil
}

// boolean reads a boolean: the next bit of the stream (tight) or a byte (loose).
func (r *owReader) boolean() (bool, error) {
	if !r.tight {
		b, err := r.byte1()
		return b != 0, err
	}
	if r.bit/8 >= len(r.bits) {
		return false, errOwShort
	}
	v := r.bits[r.bit/8]>>(r.bit%8)&1 != 0
	r.bit++
	return v, nil
}

// stream reads the tight boolean stream that follows the command type.
func (r *owReader) stream() error {
	n, err := r.byte1()
	if err != nil {
		return err
	}
	size := int(n)
	switch n {
	case 0xC0:
		b, err := r.byte1()
		if err != nil {
			return err
		}
		size = int(b)
	case 0x80:
		s, err := r.int16()
		if err != nil {
			return err
		}
		size = int(uint16(s))
	}
	if err := r.need(size); err != nil {
		return err
	}
	r.bits, r.bit = r.buf[r.pos:r.pos+size], 0
	r.pos += size
	return nil
}

func (r *owReader) long() (int64, error) {
	if !r.tight {
		if err := r.need(8); err != nil {
			return 0, err
		}
		r.pos += 8
		return int64(binary.BigEndian.Uint64(r.buf[r.pos-8:])), nil
	}
	wide, err := r.boolean()
	if err != nil {
		return 0, err
	}
	second, err := r.boolean()
	if err != nil {
		return 0, err
	}
	size := map[[2]bool]int{{false, false}: 0, {false, true}: 2, {true, false}: 4, {true, true}: 8}[[2]bool{wide, second}]
	if err := r.need(size); err != nil {
		return 0, err
	}
	var v int64
	for _, b := range r.buf[r.pos : r.pos+size] {
		v = v<<8 | int64(b)
	}
	r.pos += size
	return v, nil
}

func (r *owReader) str() (string, error) {
	present, err := r.boolean()
	if err != nil || !present {
		return "", err
	}
	if r.tight {
		if _, err := r.boolean(); err != nil { // ASCII or modified UTF-8: both a 2-byte length here
			return "", err
		}
	}
	n, err := r.int16()
	if err != nil {
		return "", err
	}
	if err := r.need(int(uint16(n))); err != nil {
		return "", err
	}
	r.pos += int(uint16(n))
	return string(r.buf[r.pos-int(uint16(n)) : r.pos]), nil
}

func (r *owReader) bytesField() error {
	present, err := r.boolean()
	if err != nil || !present {
		return err
	}
	n, err := r.int32()
	if err != nil {
		return err
	}
	if err := r.need(int(n)); err != nil {
		return err
	}
	r.pos += int(n)
	return nil
}

// nested reads a nested data structure (a destination or an id) and returns its key ("" for null).
func (r *owReader) nested() (string, error) {
	present, err := r.boolean()
	if err != nil || !present {
		return "", err
	}
	kind, err := r.byte1()
	if err != nil {
		return "", err
	}
	switch kind {
	case 100, 101, 102, 103: // queue, topic, temporary queue, temporary topic: the physical name
		name, err := r.str()
		return fmt.Sprintf("d%d:%s", kind, name), err
	case 111: // LocalTransactionId: value, connection id (cached)
		value, err := r.long()
		if err != nil {
			return "", err
		}
		conn, err := r.cached()
		return fmt.Sprintf("tx:%s:%d", conn, value), err
	case 112: // XATransactionId: format id, global id, branch qualifier
		start := r.pos
		if _, err := r.int32(); err != nil {
			return "", err
		}
		if err := r.bytesField(); err != nil {
			return "", err
		}
		if err := r.bytesField(); err != nil {
			return "", err
		}
		return fmt.Sprintf("xa:%x", r.buf[start:r.pos]), nil
	case 110: // MessageId: text view, producer id (cached), producer sequence, broker sequence
		if _, err := r.str(); err != nil {
			return "", err
		}
		producer, err := r.cached()
		if err != nil {
			return "", err
		}
		seq, err := r.long()
		if err != nil {
			return "", err
		}
		_, err = r.long()
		return fmt.Sprintf("m:%s:%d", producer, seq), err
	case 120: // ConnectionId
		v, err := r.str()
		return "c:" + v, err
	case 121: // SessionId: connection id, value
		conn, err := r.str()
		if err != nil {
			return "", err
		}
		v, err := r.long()
		return fmt.Sprintf("s:%s:%d", conn, v), err
	case 122: // ConsumerId: connection id, session id, value
		conn, session, v, err := r.strLongs()
		return fmt.Sprintf("k:%s:%d:%d", conn, session, v), err
	case 123: // ProducerId: connection id, value, session id
		conn, v, session, err := r.strLongs()
		return fmt.Sprintf("p:%s:%d:%d", conn, session, v), err
	}
	return "", fmt.Errorf("openwire: no reader for data structure %d", kind)
}

// cached reads a cached data structure: new (an index, then the structure) or an index seen before.
func (r *owReader) cached() (string, error) {
	if !r.cache {
		return r.nested()
	}
	isNew, err := r.boolean()
	if err != nil {
		return "", err
	}
	index, err := r.int16()
	if err != nil {
		return "", err
	}
	if !isNew {
		return r.seen[index], nil
	}
	key, err := r.nested()
	if err == nil && index >= 0 {
		r.seen[index] = key
	}
	return key, err
}

// strLongs reads a string and two longs: the fields of a ConsumerId and of a ProducerId.
func (r *owReader) strLongs() (string, int64, int64, error) {
	text, err := r.str()
	if err != nil {
		return "", 0, 0, err
	}
	first, err := r.long()
	if err != nil {
		return "", 0, 0, err
	}
	second, err := r.long()
	return text, first, second, err
}

// cachedAfter reads skip cached fields, then returns the next one. A field the reader does not
// need is still read: its structure may be a new cache entry that a later command names by index.
func (r *owReader) cachedAfter(skip int) (string, error) {
	for i := 0; i < skip; i++ {
		if _, err := r.cached(); err != nil {
			return "", err
		}
	}
	return r.cached()
}

// dispatched reads, after a MessageDispatch's consumer id, the id of the message it carries
// (its destination, then the message's own leading fields).
func (r *owReader) dispatched() (string, error) {
	if _, err := r.cached(); err != nil { // destination
		return "", err
	}
	present, err := r.boolean()
	if err != nil || !present {
		return "", err
	}
	kind, err := r.byte1()
	if err != nil {
		return "", err
	}
	if kind < owFirstMessage || kind > owLastMessage {
		return "", fmt.Errorf("openwire: a dispatch of data structure %d", kind)
	}
	if r.tight { // a message is marshal-aware: one more boolean (a cached form, never sent)
		if cachedForm, err := r.boolean(); err != nil || cachedForm {
			return "", errOwShort
		}
	}
	if _, err := r.int32(); err != nil { // the message's command id
		return "", err
	}
	if _, err := r.boolean(); err != nil { // responseRequired
		return "", err
	}
	if _, err := r.cachedAfter(3); err != nil { // producer, destination, transaction, original destination
		return "", err
	}
	return r.nested()
}

// base reads what every command starts with: its id (and whether it wants a response).
func (r *owReader) base() (int32, error) {
	if r.tight {
		if err := r.stream(); err != nil {
			return 0, err
		}
	}
	id, err := r.int32()
	if err != nil {
		return 0, err
	}
	_, err = r.boolean() // responseRequired
	return id, err
}

// owWireFormat reads a WireFormatInfo's wishes for tight encoding and the cache.
func owWireFormat(body []byte) (tight, cache bool) {
	flag := func(name string) bool {
		key := append([]byte{0, byte(len(name))}, name...)
		at := bytes.Index(body, key)
		end := at + len(key)
		return at >= 0 && end+1 < len(body) && body[end] == 1 && body[end+1] != 0 // BOOLEAN_TYPE, true
	}
	return flag("TightEncodingEnabled"), flag("CacheEnabled")
}

// owDelivery is a message dispatched to a consumer: its id and the op ids in its bytes.
type owDelivery struct {
	id  string
	ops []string
}

// owSession is the protocol state of one OpenWire connection.
type owSession struct {
	guarded
	find      Finder
	up, down  owFramer
	wish      [2]owFormat // what each side asked for: [0] client, [1] broker
	format    owFormat
	seen      [2]map[int16]string
	delivered map[string][]owDelivery // consumer -> the messages dispatched to it and not yet consumed, in order
	txns      map[string]opSet        // transaction -> ops it sends and consumes
	commits   map[int32][]string
}

// NewOpenWireSession returns the reader of one OpenWire connection.
func NewOpenWireSession(find Finder) Session {
	return &owSession{
		find: find, seen: [2]map[int16]string{{}, {}},
		delivered: map[string][]owDelivery{}, txns: map[string]opSet{}, commits: map[int32][]string{},
	}
}

func (s *owSession) Feed(up bool, data []byte) ([]byte, []Hit) {
	s.mu.Lock()
	defer s.mu.Unlock()
	framer, side := &s.down, 1
	if up {
		framer, side = &s.up, 0
	}
	var hits []Hit
	for _, c := range framer.feed(data) {
		if hit, ok := s.command(side, c); ok {
			hits = append(hits, hit)
		}
	}
	return data, hits
}

func (s *owSession) command(side int, c owCommand) (Hit, bool) {
	if len(c.body) == 0 {
		return Hit{}, false
	}
	kind := c.body[0]
	if kind == owWireFormatInfo {
		tight, cache := owWireFormat(c.body)
		s.wish[side] = owFormat{true, tight, cache}
		if s.wish[0].negotiated && s.wish[1].negotiated {
			s.format = owFormat{true, s.wish[0].tight && s.wish[1].tight, s.wish[0].cache && s.wish[1].cache}
		}
		return Hit{}, false
	}
	if !s.format.negotiated {
		return Hit{}, false
	}
	r := &owReader{buf: c.body, pos: 1, tight: s.format.tight, cache: s.format.cache, seen: s.seen[side]}
	hit, ok, err := s.decode(side, kind, r, c)
	if err != nil {
		return Hit{}, false // not ours to judge: the broker or client will
	}
	return hit, ok
}

func (s *owSession) decode(side int, kind byte, r *owReader, c owCommand) (Hit, bool, error) {
	id, err := r.base()
	if err != nil {
		return Hit{}, false, err
	}
	switch {
	case owIntroduces[kind]:
		// An id is sent whole the first time, as a new cache entry, and by index after: read
		// the command that introduces it, or a later ack naming it by index names nothing.
		if _, err := r.cached(); err != nil {
			return Hit{}, false, err
		}
	case side == 0 && kind >= owFirstMessage && kind <= owLastMessage:
		tx, err := r.cachedAfter(2) // producer, destination, then the transaction
		if err != nil || tx == "" {
			return Hit{}, false, err
		}
		s.txn(tx).add(s.find(c.body)...)
	case side == 0 && kind == owMessageAck:
		tx, err := r.cachedAfter(1) // destination, then the transaction
		if err != nil {
			return Hit{}, false, err
		}
		consumer, err := r.cached()
		if err != nil {
			return Hit{}, false, err
		}
		ackType, err := r.byte1()
		if err != nil {
			return Hit{}, false, err
		}
		// Read even when this ack consumes nothing: its ids may be new cache entries.
		if _, err := r.nested(); err != nil { // first message id
			return Hit{}, false, err
		}
		last, err := r.nested()
		if err != nil || (ackType != owAckStandard && ackType != owAckIndividual && ackType != owAckPoison) {
			return Hit{}, false, err
		}
		ops := s.consume(consumer, last, ackType == owAckStandard)
		if tx != "" {
			s.txn(tx).add(ops...)
		}
		return Hit{"openwire_before_ack", c.offset, ops}, true, nil
	case side == 0 && kind == owTransactionInfo:
		tx, err := r.cachedAfter(1) // connection, then the transaction
		if err != nil {
			return Hit{}, false, err
		}
		what, err := r.byte1()
		if err != nil {
			return Hit{}, false, err
		}
		switch what {
		case owCommitOnePhase, owCommitTwoPhase:
			ops := s.txns[tx].sorted()
			delete(s.txns, tx)
			if len(s.commits) < owPendingCap {
				s.commits[id] = ops
			}
			return Hit{"openwire_before_commit", c.offset, ops}, true, nil
		case owRollback:
			delete(s.txns, tx)
		}
	case side == 1 && kind == owMessageDispatch:
		consumer, err := r.cached()
		if err != nil {
			return Hit{}, false, err
		}
		id, err := r.dispatched()
		if err != nil || id == "" {
			return Hit{}, false, err
		}
		list := s.delivered[consumer]
		if len(list) >= owPendingCap || (list == nil && len(s.delivered) >= owPendingCap) {
			return Hit{}, false, nil
		}
		s.delivered[consumer] = append(list, owDelivery{id, uniqueSorted(s.find(c.body))})
	case side == 1 && (kind == owResponse || kind == owExceptionResp):
		correlation, err := r.int32()
		if err != nil {
			return Hit{}, false, err
		}
		ops, ok := s.commits[correlation]
		if !ok {
			return Hit{}, false, nil
		}
		delete(s.commits, correlation)
		if kind == owResponse { // an ExceptionResponse: the commit failed, nothing was committed
			return Hit{"openwire_after_commit", c.offset, ops}, true, nil
		}
	}
	return Hit{}, false, nil
}

// consume takes the messages an ack of consumer up to message last consumes: every one delivered
// before it too (cumulative, a standard ack), or that one alone; their ops, sorted.
func (s *owSession) consume(consumer, last string, cumulative bool) []string {
	list := s.delivered[consumer]
	ops := opSet{}
	for i, d := range list {
		if d.id != last {
			continue
		}
		if cumulative {
			for _, before := range list[:i+1] {
				ops.add(before.ops...)
			}
			list = list[i+1:]
		} else {
			ops.add(d.ops...)
			list = append(list[:i:i], list[i+1:]...)
		}
		break
	}
	if len(list) == 0 {
		delete(s.delivered, consumer)
	} else {
		s.delivered[consumer] = list
	}
	return ops.sorted()
}

func (s *owSession) txn(key string) opSet {
	set, ok := s.txns[key]
	if !ok {
		set = opSet{}
		if len(s.txns) < owPendingCap {
			s.txns[key] = set
		}
	}
	return set
}
