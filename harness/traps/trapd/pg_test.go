package main

import (
	"encoding/binary"
	"testing"
)

func pgMsg(kind byte, body []byte) []byte {
	out := []byte{kind, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(out[1:], uint32(len(body)+4))
	return append(out, body...)
}

func pgLogin(t *testing.T, s Session) {
	t.Helper()
	startup := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 8+2), 196608)
	s.Feed(true, append(startup, 0, 0))
	s.Feed(false, append(pgMsg('R', []byte{0, 0, 0, 0}), pgMsg('Z', []byte("I"))...))
}

func TestBigUnreadMessagesAreSkippedNotBuffered(t *testing.T) {
	s := NewPgSession(NewFinder(func() []string { return nil }, nil)).(*pgSession)
	pgLogin(t, s)
	s.Feed(true, pgMsg('Q', []byte("SELECT big\x00")))
	row := pgMsg('D', make([]byte, 5_000_000))
	for i := 0; i < len(row); i += 65536 {
		s.Feed(false, row[i:min(i+65536, len(row))])
		if len(s.down.body) != 0 {
			t.Fatalf("a DataRow was kept: %d bytes after chunk %d", len(s.down.body), i/65536)
		}
	}
	s.Feed(true, pgMsg('Q', []byte("COMMIT\x00")))
	if _, hits := s.Feed(false, pgMsg('C', []byte("COMMIT\x00"))); len(hits) != 1 || hits[0].Point != "pg_after_commit" {
		t.Fatalf("the COMMIT after a big row was not seen: %v", hits)
	}
}

func TestTLSMakesTheConnectionOpaque(t *testing.T) {
	for _, answer := range []byte("SG") {
		s := NewPgSession(NewFinder(func() []string { return []string{"op-1"} }, nil)).(*pgSession)
		s.Feed(true, binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 8), pgSSLRequest))
		s.Feed(false, []byte{answer})
		if !s.opaque {
			t.Fatalf("answer %q did not make the connection opaque", answer)
		}
	}
}

func TestCommitStatements(t *testing.T) {
	cases := map[string]bool{
		"COMMIT": true, "commit;": true, "  END  ": true, "insert into t values ('x'); COMMIT": true,
		"/* c */ Commit work": true, "COMMIT PREPARED 'gid'": false, "select 'commit'": false,
		"ROLLBACK": false, "-- commit\nselect 1": false,
	}
	for sql, want := range cases {
		if got := pgIsCommit([]byte(sql)); got != want {
			t.Errorf("pgIsCommit(%q) = %v, want %v", sql, got, want)
		}
	}
}
