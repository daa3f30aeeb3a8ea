package main

import (
	"bytes"
	"strconv"
	"testing"
)

func TestABigBodyIsNotKeptWhole(t *testing.T) {
	s := NewStompSession(NewFinder(func() []string { return nil }, nil)).(*stompSession)
	data := append([]byte("SEND\ndestination:/queue/q\ntransaction:t\n\n"), bytes.Repeat([]byte("x"), 1_000_000)...)
	data = append(data, 0)
	for i := 0; i < len(data); i += 4096 {
		s.Feed(true, data[i:min(i+4096, len(data))])
		if len(s.up.body) > stompBodyCap {
			t.Fatalf("a SEND body was kept beyond the cap: %d bytes", len(s.up.body))
		}
	}
	if _, hits := s.Feed(true, []byte("COMMIT\ntransaction:t\n\n\x00")); len(hits) != 1 || hits[0].Point != "stomp_before_commit" {
		t.Fatalf("the COMMIT after a big body was not seen: %v", hits)
	}
}

func TestUnacknowledgedMessagesAreCapped(t *testing.T) {
	s := NewStompSession(NewFinder(func() []string { return nil }, nil)).(*stompSession)
	var frames []byte
	for i := 0; i < stompMessagesCap+10; i++ {
		frames = append(frames, []byte("MESSAGE\nmessage-id:m"+strconv.Itoa(i)+"\n\n\x00")...)
	}
	s.Feed(false, frames)
	if s.order.Len() != stompMessagesCap || len(s.messages) != stompMessagesCap {
		t.Fatalf("remembered %d/%d messages, want the cap %d", s.order.Len(), len(s.messages), stompMessagesCap)
	}
}
