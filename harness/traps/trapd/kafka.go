// The Kafka protocol, read at the request header, plus the two responses that name brokers.
//
// Every request is size:int32, api_key:int16, api_version:int16, correlation_id:int32,
// client_id:nullable string (then tagged fields in a flexible version); every response is
// size:int32, correlation_id:int32 (then tagged fields, except ApiVersions). A response does not
// say what it answers, so a session remembers the api key of each correlation id in flight.
//
// Points: OffsetCommit (8) and TxnOffsetCommit (28) are kafka_before_offset_commit; EndTxn (26) is
// kafka_before_end_txn; a Produce (0) response is kafka_after_produce. Op ids come from a Produce
// request's bytes (its records are uncompressed unless the client sets compression.type) and are
// added to the open transaction of its transactional id, so that an EndTxn, sent on another
// connection (to the coordinator), can be aimed at an op too. An offset commit names offsets, not
// records: it is armed by nth hit.
//
// The brokers advertise the Toxiproxy address, so a client that bootstrapped through the trap
// would reach the broker around it afterwards. Metadata (3) and FindCoordinator (10) responses are
// therefore held until whole and each broker address found in the rewrite map is replaced by the
// trap's own, in every version (flexible ones included): every later connection goes through the
// trap too.
//
// The relay's cost on the clean path is the point of this reader: a message is framed, and only
// the few bytes a decision needs are looked at; a message is copied only when it is kept across
// chunks (a request's head, a Produce's records, a held response).
package main

import (
	"encoding/binary"
	"strconv"
	"strings"
	"sync"
)

// The api keys read here.
const (
	kafkaProduce         = 0
	kafkaMetadata        = 3
	kafkaOffsetCommit    = 8
	kafkaFindCoordinator = 10
	kafkaEndTxn          = 26
	kafkaTxnOffsetCommit = 28
)

// kafkaBodyCap bounds the bytes of a Produce request searched for op ids: its records beyond
// the first MiB are not searched, so a huge batch costs the relay no more than that copy.
const kafkaBodyCap = 1024 * 1024

// kafkaSmallCap bounds what is kept of an EndTxn or TxnOffsetCommit: only its head is read.
const kafkaSmallCap = 64 * 1024

// kafkaFlexible returns the first flexible version (compact strings, tagged fields) of an api, or
// one no version reaches for the apis whose bodies are not read here.
func kafkaFlexible(key int) int {
	switch key {
	case kafkaProduce, kafkaMetadata:
		return 9
	case kafkaOffsetCommit:
		return 8
	case kafkaFindCoordinator, kafkaEndTxn, kafkaTxnOffsetCommit:
		return 3
	}
	return 1 << 15
}

// kafkaKeptUp says whether a request's body is read beyond its header (for a transactional id).
func kafkaKeptUp(key int) bool {
	return key == kafkaProduce || key == kafkaEndTxn || key == kafkaTxnOffsetCommit
}

// kafkaReader is a cursor over a message body for the few Kafka types read here. A read past the
// end sets bad, and every later read returns zero, so a parser checks once, at its end, whether a
// version it does not know has misled it. A string longer than what is left is cut short rather
// than refused, as the Python reader did: only a fixed-size read or a varint past the end is bad.
type kafkaReader struct {
	buf []byte
	at  int // may pass len(buf) (by at most one): a string or tag longer than what is left
	bad bool
}

func (r *kafkaReader) fixed(n int) []byte {
	if r.bad || r.at > len(r.buf)-n {
		r.bad = true
		return nil
	}
	b := r.buf[r.at : r.at+n]
	r.at += n
	return b
}

func (r *kafkaReader) int16() int {
	b := r.fixed(2)
	if b == nil {
		return 0
	}
	return int(int16(binary.BigEndian.Uint16(b)))
}

func (r *kafkaReader) int32() int {
	b := r.fixed(4)
	if b == nil {
		return 0
	}
	return int(int32(binary.BigEndian.Uint32(b)))
}

// uvarint reads an unsigned varint; one longer than 64 bits is bad (no length here is that big).
func (r *kafkaReader) uvarint() uint64 {
	var value uint64
	for shift := uint(0); !r.bad; shift += 7 {
		if r.at >= len(r.buf) || shift > 63 {
			r.bad = true
			break
		}
		b := r.buf[r.at]
		r.at++
		value |= uint64(b&0x7F) << shift
		if b&0x80 == 0 {
			return value
		}
	}
	return 0
}

// skip moves past n bytes; past the end it stops one beyond it, where every fixed read is bad.
func (r *kafkaReader) skip(n uint64) {
	if left := len(r.buf) - r.at; left < 0 || n > uint64(left) {
		r.at = len(r.buf) + 1
		return
	}
	r.at += int(n)
}

// str reads a string (compact: varint length + 1; else int16 length); ok is false for null.
func (r *kafkaReader) str(compact bool) (value []byte, ok bool) {
	var n uint64
	if compact {
		n = r.uvarint()
		if n == 0 {
			return nil, false
		}
		n--
	} else {
		m := r.int16()
		if m < 0 {
			return nil, false
		}
		n = uint64(m)
	}
	from := min(r.at, len(r.buf))
	r.skip(n)
	return r.buf[from:min(r.at, len(r.buf))], !r.bad
}

// tags skips a tagged-fields section.
func (r *kafkaReader) tags() {
	for k := r.uvarint(); k > 0 && !r.bad; k-- {
		r.uvarint()
		r.skip(r.uvarint())
	}
}

// array reads an array's length; -1 (null) and a bad read are both "no element".
func (r *kafkaReader) array(compact bool) int {
	if compact {
		n := r.uvarint()
		if n > uint64(len(r.buf)) {
			return len(r.buf) // more than there are bytes: the element reads go bad first
		}
		return int(n) - 1
	}
	return r.int32()
}

func kafkaAppendUvarint(out []byte, value uint64) []byte {
	for value >= 0x80 {
		out = append(out, byte(value)|0x80)
		value >>= 7
	}
	return append(out, byte(value))
}

func appendKafkaString(out, value []byte, compact bool) []byte {
	if compact {
		out = kafkaAppendUvarint(out, uint64(len(value))+1)
	} else {
		out = binary.BigEndian.AppendUint16(out, uint16(len(value)))
	}
	return append(out, value...)
}

// kafkaRequestHeader returns (api key, api version, correlation id, offset of the request body)
// of a request; ok is false when the body ends inside the header.
func kafkaRequestHeader(body []byte) (key, version, corr, at int, ok bool) {
	r := kafkaReader{buf: body}
	key, version, corr = r.int16(), r.int16(), r.int32()
	r.str(false) // client_id is never compact
	if version >= kafkaFlexible(key) {
		r.tags()
	}
	return key, version, corr, r.at, !r.bad
}

// kafkaTransactionalID returns the transactional id a Produce (from v3), EndTxn or
// TxnOffsetCommit request carries, first in its body; ok is false when it carries none.
func kafkaTransactionalID(key, version int, body []byte, at int) (txn []byte, ok bool) {
	if key == kafkaProduce && version < 3 {
		return nil, false
	}
	r := kafkaReader{buf: body, at: at}
	txn, ok = r.str(version >= kafkaFlexible(key))
	return txn, ok && !r.bad
}

// kafkaAddr is where a broker address moves: the trap's own listener.
type kafkaAddr struct {
	host []byte
	port int32
}

// kafkaRewriteBrokers returns a Metadata or FindCoordinator response body (what follows the
// correlation id) with the brokers found in to moved; ok is false for a body this reader cannot
// follow (a version it does not know), which is then forwarded as it came.
func kafkaRewriteBrokers(key, version int, body []byte, to map[string]kafkaAddr) (out []byte, ok bool) {
	compact := version >= kafkaFlexible(key)
	r := kafkaReader{buf: body}
	out = make([]byte, 0, len(body)+64)
	copied := 0
	var name []byte
	move := func() {
		out = append(out, body[copied:min(r.at, len(body))]...)
		host, _ := r.str(compact) // null is written back as ""
		port := int32(r.int32())
		if r.bad {
			return
		}
		name = strconv.AppendInt(append(append(name[:0], host...), ':'), int64(port), 10)
		if addr, found := to[string(name)]; found {
			host, port = addr.host, addr.port
		}
		out = appendKafkaString(out, host, compact)
		out = binary.BigEndian.AppendUint32(out, uint32(port))
		copied = r.at
	}
	if compact {
		r.tags() // the response header's tagged fields
	}
	switch {
	case key == kafkaMetadata:
		if version >= 3 {
			r.int32() // throttle_time_ms
		}
		for n := r.array(compact); n > 0 && !r.bad; n-- {
			r.int32() // node_id
			move()
			if version >= 1 {
				r.str(compact) // rack
			}
			if compact {
				r.tags()
			}
		}
	case version < 4:
		if version >= 1 {
			r.int32()      // throttle_time_ms
			r.int16()      // error_code
			r.str(compact) // error_message
		}
		r.int32() // node_id
		move()
	default:
		r.int32() // throttle_time_ms
		for n := r.array(compact); n > 0 && !r.bad; n-- {
			r.str(compact) // key
			r.int32()      // node_id
			move()
			r.int16()      // error_code
			r.str(compact) // error_message
			r.tags()
		}
	}
	if r.bad {
		return nil, false
	}
	return append(out, body[copied:]...), true
}

// KafkaCluster is what the connections of one Kafka trap share: the open transactions, by
// transactional id (a client produces on the partition leaders' connections and ends the
// transaction on the coordinator's), and the broker addresses to rewrite.
type KafkaCluster struct {
	find    Finder
	rewrite map[string]kafkaAddr // "host:port" as a broker advertises it -> the trap's listener

	mu   sync.Mutex
	txns map[string]opSet
}

// NewKafkaCluster returns a cluster whose sessions find op ids with find and move the brokers
// named by rewrite ("host:port" of an upstream broker -> "host:port" of the trap's listener; the
// port follows the last colon). An entry whose target port is not a number is left out: it could
// not be written into a response.
func NewKafkaCluster(find Finder, rewrite map[string]string) *KafkaCluster {
	to := make(map[string]kafkaAddr, len(rewrite))
	for from, target := range rewrite {
		cut := strings.LastIndexByte(target, ':')
		if cut < 0 {
			continue
		}
		port, err := strconv.ParseInt(target[cut+1:], 10, 32)
		if err != nil {
			continue
		}
		to[from] = kafkaAddr{host: []byte(target[:cut]), port: int32(port)}
	}
	return &KafkaCluster{find: find, rewrite: to, txns: map[string]opSet{}}
}

// Session returns the reader of one more connection of this cluster.
func (c *KafkaCluster) Session() Session {
	s := &kafkaSession{cluster: c, inflight: map[int32]kafkaInfo{}}
	s.up = kafkaFramer{decide: s.decideUp}
	s.down = kafkaFramer{decide: s.decideDown, transform: s.rewrite}
	s.up.reset()
	s.down.reset()
	return s
}

func (c *KafkaCluster) add(txn []byte, ops []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	set, found := c.txns[string(txn)]
	if !found {
		set = opSet{}
		c.txns[string(txn)] = set
	}
	set.add(ops...)
}

// end returns the ops of a transaction and forgets it: a later EndTxn of the same id is another
// transaction.
func (c *KafkaCluster) end(txn []byte) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	set := c.txns[string(txn)]
	delete(c.txns, string(txn))
	return set.sorted()
}

func (c *KafkaCluster) peek(txn []byte) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.txns[string(txn)].sorted()
}

// kafkaInfo is what a session knows of a message: its request's api key and version and ops.
type kafkaInfo struct {
	key, version int
	ops          []string
}

var kafkaNone = kafkaInfo{key: -1, ops: []string{}}

// kafkaFramer splits one direction into size-prefixed messages. It forwards a message's bytes as
// they come, except its size and first bytes, staged until decide has seen them (a hit's offset
// must be the message's first byte in the bytes returned, and a held message must not have begun
// to leave), and except a held message, staged whole and replaced by transform(body).
type kafkaFramer struct {
	decide    func(size int, first []byte) (keep int, hold bool, info kafkaInfo)
	transform func(body []byte, info kafkaInfo) []byte

	staged  []byte // this message's bytes from earlier chunks, not forwarded yet
	msgAt   int    // where, in this chunk, its bytes not forwarded yet begin
	body    []byte // the kept body bytes from earlier chunks
	bodyAt  int    // -1, or where in this chunk the kept body lies whole (bodyLen bytes)
	bodyLen int
	size    int // -1: reading the size prefix
	need    int // body bytes still to come
	keep    int // -1: not decided yet
	hold    bool
	info    kafkaInfo
	start   int // the offset of this message's first byte in this chunk's output
}

func (f *kafkaFramer) reset() {
	f.staged, f.body = f.staged[:0], f.body[:0]
	f.bodyAt, f.bodyLen = -1, 0
	f.size, f.need, f.keep, f.hold, f.info = -1, 0, -1, false, kafkaNone
}

// pending returns this message's bytes not forwarded yet; a message begun in an earlier chunk
// has them all moved into staged, so that they are one slice.
func (f *kafkaFramer) pending(data []byte, i int) []byte {
	if len(f.staged) == 0 {
		return data[f.msgAt:i]
	}
	f.staged = append(f.staged, data[f.msgAt:i]...)
	f.msgAt = i
	return f.staged
}

func (f *kafkaFramer) keptLen() int {
	if f.bodyAt >= 0 {
		return f.bodyLen
	}
	return len(f.body)
}

// feed frames data, adds the bytes to forward now to out, and calls read(offset in out, kept
// body, info) for each message that ends here. The body read is given may be data itself: it is
// valid during the call only.
func (f *kafkaFramer) feed(data []byte, out *kafkaOut, read func(start int, body []byte, info kafkaInfo)) {
	f.start, f.msgAt = 0, 0 // a message begun in an earlier chunk starts this chunk's output
	i, n := 0, len(data)
frame:
	for i < n {
		switch {
		case f.size < 0:
			take := min(4-len(f.staged)-(i-f.msgAt), n-i)
			i += take
			p := f.pending(data, i)
			if len(p) < 4 {
				break frame
			}
			f.size = max(0, int(int32(binary.BigEndian.Uint32(p))))
			f.need = f.size
		case f.keep < 0:
			take := min(f.need, n-i, 8-(len(f.staged)+i-f.msgAt-4))
			i += take
			f.need -= take
		default:
			take := min(f.need, n-i)
			if room := f.keep - f.keptLen(); room > 0 {
				f.keepBody(data, i, i+min(room, take))
			}
			if !f.hold {
				out.fromData(i, i+take)
			}
			i += take
			f.need -= take
		}
		if f.keep < 0 && (len(f.staged)+i-f.msgAt-4 >= 8 || f.need == 0) {
			p := f.pending(data, i)
			first := p[4:]
			f.keep, f.hold, f.info = f.decide(f.size, first)
			kept := first[:min(f.keep, len(first))]
			if len(f.staged) == 0 {
				f.bodyAt, f.bodyLen = f.msgAt+4, len(kept)
			} else {
				f.body = append(f.body[:0], kept...)
			}
			if !f.hold {
				f.start = out.len()
				if len(f.staged) == 0 {
					out.fromData(f.msgAt, i)
				} else {
					out.other(f.staged)
					f.staged = f.staged[:0]
				}
				f.msgAt = i
			}
		}
		if f.keep >= 0 && f.need == 0 {
			if f.hold {
				p := f.pending(data, i)
				body := f.transform(p[4:], f.info)
				f.start = out.len()
				out.other(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body)
			}
			kept := f.body
			if f.bodyAt >= 0 {
				kept = data[f.bodyAt : f.bodyAt+f.bodyLen]
			}
			read(f.start, kept, f.info)
			f.reset()
			f.msgAt = i
		}
	}
	// What this message still owes the next chunk is copied: the caller reuses data.
	if f.size < 0 || f.keep < 0 || f.hold {
		f.staged = append(f.staged, data[f.msgAt:n]...)
	}
	if f.bodyAt >= 0 {
		f.body = append(f.body[:0], data[f.bodyAt:f.bodyAt+f.bodyLen]...)
		f.bodyAt = -1
	}
}

// keepBody adds data[i:j] to the kept body: a view of data while the body lies whole in this
// chunk, a copy otherwise.
func (f *kafkaFramer) keepBody(data []byte, i, j int) {
	if f.bodyAt >= 0 && f.bodyAt+f.bodyLen == i {
		f.bodyLen += j - i
		return
	}
	if f.bodyAt >= 0 {
		f.body = append(f.body[:0], data[f.bodyAt:f.bodyAt+f.bodyLen]...)
		f.bodyAt = -1
	}
	f.body = append(f.body, data[i:j]...)
}

// kafkaOut is the bytes a chunk forwards: a slice of the chunk itself while they are one run of
// it (the clean path: nothing copied), a new buffer once staged or rewritten bytes join them.
type kafkaOut struct {
	data   []byte
	lo, hi int
	buf    []byte
	owned  bool
}

func (o *kafkaOut) len() int {
	if o.owned {
		return len(o.buf)
	}
	return o.hi - o.lo
}

func (o *kafkaOut) fromData(i, j int) {
	if i == j {
		return
	}
	if !o.owned {
		switch {
		case o.lo == o.hi:
			o.lo, o.hi = i, j
			return
		case o.hi == i:
			o.hi = j
			return
		}
		o.own()
	}
	o.buf = append(o.buf, o.data[i:j]...)
}

func (o *kafkaOut) other(parts ...[]byte) {
	if !o.owned {
		o.own()
	}
	for _, part := range parts {
		o.buf = append(o.buf, part...)
	}
}

func (o *kafkaOut) own() {
	o.buf = append(make([]byte, 0, len(o.data)+64), o.data[o.lo:o.hi]...)
	o.owned = true
}

func (o *kafkaOut) bytes() []byte {
	if o.owned {
		return o.buf
	}
	return o.data[o.lo:o.hi]
}

// kafkaSession is the protocol state of one Kafka connection: the request of each correlation
// id in flight, so that a response is known by its request.
type kafkaSession struct {
	guarded
	cluster  *KafkaCluster
	inflight map[int32]kafkaInfo
	up, down kafkaFramer
	hits     []Hit
}

// Feed frames one chunk; up is client -> server.
func (s *kafkaSession) Feed(up bool, data []byte) ([]byte, []Hit) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := kafkaOut{data: data}
	s.hits = nil
	if up {
		s.up.feed(data, &out, s.readUp)
	} else {
		s.down.feed(data, &out, s.readDown)
	}
	hits := s.hits
	s.hits = nil
	return out.bytes(), hits
}

// decideUp keeps a request's head (its api key, version and correlation id), and more of the
// requests whose transactional id or records are read.
func (s *kafkaSession) decideUp(size int, first []byte) (int, bool, kafkaInfo) {
	key := -1
	if len(first) >= 2 {
		key = int(int16(binary.BigEndian.Uint16(first)))
	}
	switch {
	case key == kafkaProduce:
		return min(size, kafkaBodyCap), false, kafkaNone
	case kafkaKeptUp(key):
		return min(size, kafkaSmallCap), false, kafkaNone
	}
	return 8, false, kafkaNone
}

// decideDown knows a response by its correlation id, and holds the ones whose brokers move. It
// keeps no body (a held one is staged whole anyway): the correlation id, all a response is read
// for, is read here.
func (s *kafkaSession) decideDown(_ int, first []byte) (int, bool, kafkaInfo) {
	corr := int32(-1)
	if len(first) >= 4 {
		corr = int32(binary.BigEndian.Uint32(first))
	}
	info, found := s.inflight[corr]
	if !found {
		info = kafkaNone
	}
	delete(s.inflight, corr)
	if (info.key == kafkaMetadata || info.key == kafkaFindCoordinator) && len(s.cluster.rewrite) > 0 {
		return 0, true, info
	}
	return 0, false, info
}

// rewrite moves the brokers of a held response; a body it cannot follow is forwarded as it came.
func (s *kafkaSession) rewrite(body []byte, info kafkaInfo) []byte {
	if len(body) >= 4 {
		if moved, ok := kafkaRewriteBrokers(info.key, info.version, body[4:], s.cluster.rewrite); ok {
			return append(append(make([]byte, 0, 4+len(moved)), body[:4]...), moved...)
		}
	}
	return body
}

func (s *kafkaSession) readUp(start int, body []byte, _ kafkaInfo) {
	if len(body) < 8 {
		return
	}
	key := int(int16(binary.BigEndian.Uint16(body)))
	version := int(int16(binary.BigEndian.Uint16(body[2:])))
	corr := int32(binary.BigEndian.Uint32(body[4:]))
	ops := []string{}
	if kafkaKeptUp(key) {
		var txn []byte
		_, _, _, at, ok := kafkaRequestHeader(body)
		if ok {
			txn, ok = kafkaTransactionalID(key, version, body, at)
		}
		switch key {
		case kafkaProduce:
			ops = kafkaSortedOps(s.cluster.find(body))
			if ok {
				s.cluster.add(txn, ops)
			}
		case kafkaEndTxn:
			if ok {
				ops = s.cluster.end(txn)
			}
			s.hits = append(s.hits, Hit{Point: "kafka_before_end_txn", Offset: start, Ops: ops})
		default:
			if ok {
				ops = s.cluster.peek(txn)
			}
		}
	}
	if key == kafkaOffsetCommit || key == kafkaTxnOffsetCommit {
		s.hits = append(s.hits, Hit{Point: "kafka_before_offset_commit", Offset: start, Ops: ops})
	}
	s.inflight[corr] = kafkaInfo{key: key, version: version, ops: ops}
}

func (s *kafkaSession) readDown(start int, _ []byte, info kafkaInfo) {
	if info.key == kafkaProduce {
		s.hits = append(s.hits, Hit{Point: "kafka_after_produce", Offset: start, Ops: info.ops})
	}
}

// kafkaSortedOps returns ops sorted and unique, as a Hit carries them, copying only when they
// are not.
func kafkaSortedOps(ops []string) []string {
	if ops == nil {
		return []string{}
	}
	for k := 1; k < len(ops); k++ {
		if ops[k-1] >= ops[k] {
			return uniqueSorted(ops)
		}
	}
	return ops
}
