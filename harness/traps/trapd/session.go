// The contract between the relay and the protocol readers (pg.go, stomp.go, openwire.go, kafka.go).
//
// A Session is the protocol state of one relayed connection. Feed is called per chunk read, in
// order, from two goroutines (one per direction), so a session guards its state with a mutex. It
// returns the bytes to forward (the chunk itself, except where a protocol rewrites or holds back a
// message until it is whole) and the hits in them: "this message is trap point P for ops {...},
// starting at byte Offset of the returned bytes". The relay owns the chunk: a session copies what
// it keeps beyond the call.
package main

import (
	"bytes"
	"regexp"
	"sort"
	"sync"
)

// Hit is a trap point seen in one chunk.
type Hit struct {
	Point  string
	Offset int
	Ops    []string // sorted, unique; empty when no op id was recognised
}

// Session is one connection's protocol reader.
type Session interface {
	Feed(up bool, data []byte) ([]byte, []Hit)
}

// Finder finds op ids in bytes: the armed ones, and every match of the proxy's op pattern.
type Finder func(data []byte) []string

// opSet is a small set of op ids, returned sorted.
type opSet map[string]struct{}

func (s opSet) add(ops ...string) {
	for _, op := range ops {
		s[op] = struct{}{}
	}
}

func (s opSet) sorted() []string {
	out := make([]string, 0, len(s))
	for op := range s {
		out = append(out, op)
	}
	sort.Strings(out)
	return out
}

// uniqueSorted returns ops without repeats, in order.
func uniqueSorted(ops []string) []string {
	set := opSet{}
	set.add(ops...)
	return set.sorted()
}

// NewFinder returns a Finder over the ops armed() returns and the matches of pattern (may be nil).
func NewFinder(armed func() []string, pattern *regexp.Regexp) Finder {
	return func(data []byte) []string {
		found := opSet{}
		for _, op := range armed() {
			if containsBytes(data, op) {
				found.add(op)
			}
		}
		if pattern != nil {
			for _, m := range pattern.FindAll(data, -1) {
				found.add(string(m))
			}
		}
		return found.sorted()
	}
}

func containsBytes(data []byte, s string) bool {
	return bytes.Contains(data, []byte(s))
}

// guarded is embedded by sessions: one mutex for the two pumps of a connection.
type guarded struct{ mu sync.Mutex }
