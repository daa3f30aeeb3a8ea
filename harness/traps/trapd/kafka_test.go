// The Kafka reader: request headers, the ops of produced records and transactions, broker
// rewrites. A port of tests/unit/test_traps_kafka.py (the spec), plus what only Go can get wrong:
// a chunk's buffer reused by the caller after Feed.
package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"testing"
)

type kafkaAddrT struct {
	host string
	port int
}

var (
	kToxi  = kafkaAddrT{"127.0.0.1", 19092}
	kTrap  = kafkaAddrT{"127.0.0.1", 41234}
	kOther = kafkaAddrT{"127.0.0.1", 19093}
)

func kUvarint(n int) []byte { return kafkaAppendUvarint(nil, uint64(n)) }

// str encodes a Kafka string; nil is null.
func kStr(value *string, compact bool) []byte {
	if value == nil {
		if compact {
			return kUvarint(0)
		}
		return kBe16(-1)
	}
	if compact {
		return append(kUvarint(len(*value)+1), *value...)
	}
	return append(kBe16(len(*value)), *value...)
}

func kS(value string) []byte             { return kStr(&value, false) }
func kSc(value string, flex bool) []byte { return kStr(&value, flex) }

func kBe16(n int) []byte { return binary.BigEndian.AppendUint16(nil, uint16(int16(n))) }
func kBe32(n int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(int32(n))) }
func kBe64(n int) []byte { return binary.BigEndian.AppendUint64(nil, uint64(n)) }

func kCat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func kSized(body []byte) []byte { return kCat(kBe32(len(body)), body) }

func kTags(flexible bool) []byte {
	if flexible {
		return []byte{0}
	}
	return nil
}

func kRequest(key, version, corr int, body []byte, flexible bool) []byte {
	return kSized(kCat(kBe16(key), kBe16(version), kBe32(corr), kS("rdkafka"), kTags(flexible), body))
}

func kResponse(corr int, body []byte, flexible bool) []byte {
	return kSized(kCat(kBe32(corr), kTags(flexible), body))
}

type kBroker struct {
	node int
	addr kafkaAddrT
}

// metadataBrokers encodes a Metadata response body up to and including its brokers, then a
// marker tail.
func kMetadataBrokers(version int, brokers []kBroker) []byte {
	flex := version >= 9
	var out []byte
	if version >= 3 {
		out = kBe32(0)
	}
	if flex {
		out = append(out, kUvarint(len(brokers)+1)...)
	} else {
		out = append(out, kBe32(len(brokers))...)
	}
	for _, b := range brokers {
		out = kCat(out, kBe32(b.node), kSc(b.addr.host, flex), kBe32(b.addr.port))
		if version >= 1 {
			out = append(out, kSc("rack-a", flex)...)
		}
		out = append(out, kTags(flex)...)
	}
	return kCat(out, []byte("TAIL-UNCHANGED"))
}

func kFindCoordinator(version int, addr kafkaAddrT) []byte {
	flex := version >= 3
	if version >= 4 {
		one := kCat(kSc("group-1", true), kBe32(1), kSc(addr.host, true), kBe32(addr.port), kBe16(0))
		return kCat(kBe32(0), kUvarint(2), one, kStr(nil, true), []byte{0}, []byte{0})
	}
	var out []byte
	if version >= 1 {
		out = kCat(kBe32(0), kBe16(0), kStr(nil, flex))
	}
	return kCat(out, kBe32(1), kSc(addr.host, flex), kBe32(addr.port), kTags(flex))
}

func kArmed(ops ...string) Finder {
	return NewFinder(func() []string { return ops }, nil)
}

func (a kafkaAddrT) String() string { return fmt.Sprintf("%s:%d", a.host, a.port) }

func kSession(ops ...string) Session {
	return NewKafkaCluster(kArmed(ops...), map[string]string{kToxi.String(): kTrap.String()}).Session()
}

// roundtrip feeds a request up and its response down (whole, or byte by byte, with the hits'
// offsets moved into the whole output).
func kRoundtrip(sess Session, req, resp []byte, bytewise bool) (upHits []Hit, out []byte, downHits []Hit) {
	_, upHits = sess.Feed(true, req)
	if !bytewise {
		out, downHits = sess.Feed(false, resp)
		return upHits, slices.Clone(out), downHits
	}
	for i := range resp {
		chunk, hits := sess.Feed(false, resp[i:i+1])
		for _, h := range hits {
			downHits = append(downHits, Hit{Point: h.Point, Offset: len(out) + h.Offset, Ops: h.Ops})
		}
		out = append(out, chunk...)
	}
	return upHits, out, downHits
}

// sameHits compares hits as the Python tests do: an empty op set is nil or empty alike.
func kSameHits(t *testing.T, got, want []Hit) {
	t.Helper()
	same := len(got) == len(want)
	for k := 0; same && k < len(got); k++ {
		same = got[k].Point == want[k].Point && got[k].Offset == want[k].Offset &&
			slices.Equal(got[k].Ops, want[k].Ops)
	}
	if !same {
		t.Fatalf("hits %+v, want %+v", got, want)
	}
}

func TestKafkaMetadataBrokersAtTheToxiproxyAddressMoveToTheTrap(t *testing.T) {
	for _, version := range []int{0, 1, 2, 5, 8, 9, 12} {
		for _, bytewise := range []bool{false, true} {
			t.Run(fmt.Sprintf("v%d/bytewise=%v", version, bytewise), func(t *testing.T) {
				flex := version >= 9
				before := kMetadataBrokers(version, []kBroker{{1, kToxi}, {2, kOther}})
				_, out, _ := kRoundtrip(kSession(), kRequest(kafkaMetadata, version, 7, nil, flex),
					kResponse(7, before, flex), bytewise)
				want := kResponse(7, kMetadataBrokers(version, []kBroker{{1, kTrap}, {2, kOther}}), flex)
				if !bytes.Equal(out, want) {
					t.Fatalf("out %q\nwant %q", out, want)
				}
			})
		}
	}
}

func TestKafkaFindCoordinatorMovesToTheTrap(t *testing.T) {
	for _, version := range []int{0, 1, 2, 3, 4} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			flex := version >= 3
			_, out, _ := kRoundtrip(kSession(),
				kRequest(kafkaFindCoordinator, version, 3, kSc("group-1", flex), flex),
				kResponse(3, kFindCoordinator(version, kToxi), flex), false)
			if want := kResponse(3, kFindCoordinator(version, kTrap), flex); !bytes.Equal(out, want) {
				t.Fatalf("out %q\nwant %q", out, want)
			}
		})
	}
}

func TestKafkaOtherResponsesPassUnchangedAndAreNotHeld(t *testing.T) {
	sess := kSession()
	fetch := kResponse(9, bytes.Repeat([]byte("F"), 100_000), false)
	sess.Feed(true, kRequest(1, 11, 9, []byte("fetch"), false))
	out, hits := sess.Feed(false, fetch[:5000])
	if !bytes.Equal(out, fetch[:5000]) || len(hits) != 0 {
		t.Fatalf("first chunk: %d bytes, hits %+v", len(out), hits)
	}
	out, hits = sess.Feed(false, fetch[5000:])
	if !bytes.Equal(out, fetch[5000:]) || len(hits) != 0 {
		t.Fatalf("second chunk: %d bytes, hits %+v", len(out), hits)
	}
}

// produceV3 is not a real record batch: bytes to search.
func kProduceV3(txn *string, values ...string) []byte {
	var records []byte
	for _, v := range values {
		records = kCat(records, kBe32(len(v)), []byte(v))
	}
	return kCat(kStr(txn, false), kBe16(-1), kBe32(30000), records)
}

func kPtr(value string) *string { return &value }

func TestKafkaProduceAckFiresAfterWithTheOpsOfItsRecords(t *testing.T) {
	sess := kSession("op-1", "op-2")
	req := kRequest(kafkaProduce, 3, 11, kProduceV3(nil, `{"op":"op-2"}`), false)
	resp := kResponse(11, []byte("produce-response-body"), false)
	upHits, out, downHits := kRoundtrip(sess, req, resp, true)
	kSameHits(t, upHits, nil)
	if !bytes.Equal(out, resp) {
		t.Fatalf("out %q, want %q", out, resp)
	}
	// Held from its last byte: the hit is where the response begins in the whole output.
	kSameHits(t, downHits, []Hit{{Point: "kafka_after_produce", Offset: len(resp) - 1, Ops: []string{"op-2"}}})
}

func TestKafkaEndTxnCarriesTheOpsProducedInItsTransactionAcrossConnections(t *testing.T) {
	cluster := NewKafkaCluster(kArmed("op-4"), map[string]string{})
	leader, coordinator := cluster.Session(), cluster.Session()
	leader.Feed(true, kRequest(kafkaProduce, 3, 1, kProduceV3(kPtr("tx-a"), "op-4"), false))
	leader.Feed(true, kRequest(kafkaProduce, 3, 2, kProduceV3(kPtr("tx-b"), "op-5"), false))
	end := kCat(kSc("tx-a", true), kBe64(1), kBe16(0), []byte{1})
	_, hits := coordinator.Feed(true, kRequest(kafkaEndTxn, 3, 5, end, true))
	kSameHits(t, hits, []Hit{{Point: "kafka_before_end_txn", Offset: 0, Ops: []string{"op-4"}}})
	_, hits = coordinator.Feed(true, kRequest(kafkaEndTxn, 1, 6, kCat(kS("tx-a"), kBe64(1), kBe16(0), []byte{1}), false))
	// The transaction ended: its ops are gone.
	kSameHits(t, hits, []Hit{{Point: "kafka_before_end_txn", Offset: 0, Ops: []string{}}})
}

func TestKafkaOffsetCommitsAreHitAtTheirRequest(t *testing.T) {
	sess := kSession()
	first := kRequest(1, 11, 1, []byte("fetch"), false)
	commit := kRequest(kafkaOffsetCommit, 8, 2, kCat(kSc("group-1", true), []byte("rest")), true)
	_, hits := sess.Feed(true, kCat(first, commit))
	kSameHits(t, hits, []Hit{{Point: "kafka_before_offset_commit", Offset: len(first), Ops: []string{}}})
}

// The caller reuses a chunk's buffer once Feed returns: what a session keeps across chunks (a
// request's head, a Produce's records, a held response) must be its own copy.
func TestKafkaChunksSplitAnywhereInAReusedBufferReadAsWhole(t *testing.T) {
	stream := kCat(
		kRequest(kafkaProduce, 3, 1, kProduceV3(kPtr("tx-a"), `{"op":"op-7"}`), false),
		kRequest(1, 11, 2, []byte("fetch"), false),
		kRequest(kafkaMetadata, 9, 3, nil, true),
		kRequest(kafkaEndTxn, 3, 4, kCat(kSc("tx-a", true), kBe64(1), kBe16(0), []byte{1}), true),
	)
	downStream := kCat(
		kResponse(1, []byte("produce-response-body"), false),
		kResponse(2, bytes.Repeat([]byte("F"), 300), false),
		kResponse(3, kMetadataBrokers(9, []kBroker{{1, kToxi}}), true),
	)
	wantDown := kCat(
		kResponse(1, []byte("produce-response-body"), false),
		kResponse(2, bytes.Repeat([]byte("F"), 300), false),
		kResponse(3, kMetadataBrokers(9, []kBroker{{1, kTrap}}), true),
	)
	// A hit is where its message's bytes not yet forwarded begin: its first byte, or the start of
	// the chunk that ends it when its head left in an earlier chunk (the relay then holds its tail).
	for _, size := range []int{1, 2, 3, 5, 7, 13, 64} {
		t.Run(fmt.Sprintf("chunk=%d", size), func(t *testing.T) {
			hitAt := func(from, to int) int { return max(from, (to-1)/size*size) }
			cluster := NewKafkaCluster(kArmed("op-7"), map[string]string{kToxi.String(): kTrap.String()})
			sess := cluster.Session()
			feed := func(up bool, whole []byte) ([]byte, []Hit) {
				var out []byte
				var all []Hit
				buf := make([]byte, size)
				for at := 0; at < len(whole); at += size {
					n := copy(buf, whole[at:])
					chunk, hits := sess.Feed(up, buf[:n])
					for _, h := range hits {
						all = append(all, Hit{Point: h.Point, Offset: len(out) + h.Offset, Ops: h.Ops})
					}
					out = append(out, chunk...)
					for k := range buf {
						buf[k] = 0xEE // the caller's next read overwrites the chunk
					}
				}
				return out, all
			}
			upOut, upHits := feed(true, stream)
			if !bytes.Equal(upOut, stream) {
				t.Fatalf("up out %q\nwant %q", upOut, stream)
			}
			endAt := len(stream) - len(kRequest(kafkaEndTxn, 3, 4, kCat(kSc("tx-a", true), kBe64(1), kBe16(0), []byte{1}), true))
			kSameHits(t, upHits, []Hit{{Point: "kafka_before_end_txn", Offset: hitAt(endAt, len(stream)), Ops: []string{"op-7"}}})
			downOut, downHits := feed(false, downStream)
			if !bytes.Equal(downOut, wantDown) {
				t.Fatalf("down out %q\nwant %q", downOut, wantDown)
			}
			produceEnd := len(kResponse(1, []byte("produce-response-body"), false))
			kSameHits(t, downHits, []Hit{{Point: "kafka_after_produce", Offset: hitAt(0, produceEnd), Ops: []string{"op-7"}}})
		})
	}
}

// A version this reader does not know, or a body cut short, is forwarded as it came.
func TestKafkaAnUnreadableBrokerListIsForwardedAsItCame(t *testing.T) {
	sess := kSession()
	sess.Feed(true, kRequest(kafkaMetadata, 9, 7, nil, true))
	cut := kResponse(7, kMetadataBrokers(9, []kBroker{{1, kToxi}})[:12], true)
	out, _ := sess.Feed(false, cut)
	if !bytes.Equal(out, cut) {
		t.Fatalf("out %q, want %q", out, cut)
	}
}

// BenchmarkKafkaCleanPath measures what the relay adds to a message nobody reads: framing only.
func BenchmarkKafkaCleanPath(b *testing.B) {
	sess := kSession("op-1")
	fetch := kResponse(9, bytes.Repeat([]byte("F"), 1<<20), false)
	b.SetBytes(int64(len(fetch)))
	for range b.N {
		sess.Feed(true, kRequest(1, 11, 9, []byte("fetch"), false))
		for at := 0; at < len(fetch); at += 32 * 1024 {
			sess.Feed(false, fetch[at:min(at+32*1024, len(fetch))])
		}
	}
}

// The two pumps of a connection feed at once, and the connections of a cluster share its
// transactions: run with -race.
func TestKafkaPumpsAndConnectionsFeedAtOnce(t *testing.T) {
	cluster := NewKafkaCluster(kArmed("op-1"), map[string]string{kToxi.String(): kTrap.String()})
	var done sync.WaitGroup
	for c := 0; c < 2; c++ {
		sess := cluster.Session()
		done.Add(2)
		go func() {
			defer done.Done()
			for k := 0; k < 200; k++ {
				sess.Feed(true, kRequest(kafkaProduce, 3, k, kProduceV3(kPtr("tx-a"), "op-1"), false))
				sess.Feed(true, kRequest(kafkaEndTxn, 1, k, kCat(kS("tx-a"), kBe64(1), kBe16(0), []byte{1}), false))
			}
		}()
		go func() {
			defer done.Done()
			for k := 0; k < 200; k++ {
				sess.Feed(false, kResponse(k, []byte("produce-response-body"), false))
			}
		}()
	}
	done.Wait()
}

// FuzzKafkaBrokerRewrite feeds any Metadata or FindCoordinator response body, in any chunks: the
// reader must not panic (it would take the relay down), and a body it cannot read must leave as
// it came.
func FuzzKafkaBrokerRewrite(f *testing.F) {
	for _, version := range []int{0, 1, 5, 9, 12} {
		f.Add(true, version, 3, kMetadataBrokers(version, []kBroker{{1, kToxi}, {2, kOther}}))
	}
	for _, version := range []int{0, 1, 3, 4} {
		f.Add(false, version, 5, kFindCoordinator(version, kToxi))
	}
	f.Fuzz(func(t *testing.T, metadata bool, version, chunk int, body []byte) {
		key := kafkaFindCoordinator
		if metadata {
			key = kafkaMetadata
		}
		version = version & 0x7FFF
		chunk = 1 + chunk&0xFF
		sess := kSession()
		sess.Feed(true, kRequest(key, version, 7, nil, false))
		resp := kResponse(7, body, false)
		var out []byte
		for at := 0; at < len(resp); at += chunk {
			part, _ := sess.Feed(false, slices.Clone(resp[at:min(at+chunk, len(resp))]))
			out = append(out, part...)
		}
		if _, ok := kafkaRewriteBrokers(key, version, body, map[string]kafkaAddr{}); !ok && !bytes.Equal(out, resp) {
			t.Fatalf("an unreadable body changed: %q -> %q", resp, out)
		}
	})
}

// FuzzKafkaRequests feeds any request stream, in any chunks: the reader must not panic, and it
// holds no request back, so what leaves is what came, but for a message still unfinished.
func FuzzKafkaRequests(f *testing.F) {
	f.Add(3, kCat(
		kRequest(kafkaProduce, 3, 1, kProduceV3(kPtr("tx-a"), "op-1"), false),
		kRequest(kafkaTxnOffsetCommit, 3, 2, kSc("tx-a", true), true),
		kRequest(kafkaEndTxn, 3, 3, kCat(kSc("tx-a", true), kBe64(1), kBe16(0), []byte{1}), true),
		kRequest(kafkaOffsetCommit, 8, 4, kSc("group-1", true), true),
	))
	f.Fuzz(func(t *testing.T, chunk int, stream []byte) {
		chunk = 1 + chunk&0xFF
		sess := kSession("op-1")
		var out []byte
		for at := 0; at < len(stream); at += chunk {
			part, hits := sess.Feed(true, slices.Clone(stream[at:min(at+chunk, len(stream))]))
			for _, h := range hits {
				if h.Offset < 0 || h.Offset > len(part) || !slices.IsSorted(h.Ops) {
					t.Fatalf("hit %+v in %d bytes", h, len(part))
				}
			}
			out = append(out, part...)
		}
		if !bytes.HasPrefix(stream, out) {
			t.Fatalf("%q left as %q", stream, out)
		}
	})
}

// BenchmarkKafkaProduce measures a produced record's round trip: its request searched for op ids
// (in place: it lies whole in its chunk), its transaction noted, its response known.
func BenchmarkKafkaProduce(b *testing.B) {
	sess := kSession("op-1")
	req := kRequest(kafkaProduce, 3, 11, kProduceV3(kPtr("tx-a"), string(bytes.Repeat([]byte("v"), 1000))), false)
	resp := kResponse(11, []byte("produce-response-body"), false)
	b.SetBytes(int64(len(req)))
	for range b.N {
		sess.Feed(true, req)
		sess.Feed(false, resp)
	}
}
