package txcontrol

import "testing"

func TestFind(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		sql  string
		want string // "" when none
	}{
		{"COMMIT", "COMMIT"},
		{"  commit work ", "commit work"},
		{"END", "END"},
		{"abort", "abort"},
		{"ROLLBACK", "ROLLBACK"},
		{"rollback and chain", "rollback and chain"},
		{"BEGIN ISOLATION LEVEL SERIALIZABLE", "BEGIN ISOLATION LEVEL SERIALIZABLE"},
		{"start transaction", "start transaction"},
		{"PREPARE TRANSACTION 'x'", "PREPARE TRANSACTION 'x'"},
		{"COMMIT PREPARED 'x'", "COMMIT PREPARED 'x'"},
		{"-- a comment\nCOMMIT", "-- a comment\nCOMMIT"},
		{"/* a /* nested */ comment */ commit", "/* a /* nested */ comment */ commit"},
		{"INSERT INTO t VALUES (1); COMMIT", "COMMIT"},
		{"INSERT INTO t VALUES (1);COMMIT;BEGIN", "COMMIT"},
		{"SELECT 1;\n-- then\nend;", "-- then\nend"},

		{"INSERT INTO t VALUES ('x; COMMIT')", ""},
		{"INSERT INTO t VALUES (E'x\\'; COMMIT')", ""},
		{"INSERT INTO t VALUES ('it''s; COMMIT')", ""},
		{`SELECT 1 AS "a; commit"`, ""},
		{"SELECT $$; COMMIT$$", ""},
		{"SELECT $tag$ $$; COMMIT $tag$", ""},
		{"SELECT $1::int; SELECT 2", ""},
		{"SELECT 1 -- ; COMMIT", ""},
		{"SELECT 1 /* ; COMMIT */", ""},
		{"ROLLBACK TO SAVEPOINT sp", ""},
		{"rollback to sp", ""},
		{"SAVEPOINT sp; RELEASE sp", ""},
		{"SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", ""},
		{"PREPARE q AS SELECT 1", ""},
		{"UPDATE t SET begin = 1", ""},
		{"SELECT committed FROM t", ""},
		{"", ""},
		{";;", ""},
	} {
		got, ok := Find(c.sql)
		if ok != (c.want != "") || got != c.want {
			t.Errorf("Find(%q) = %q, %v; want %q", c.sql, got, ok, c.want)
		}
	}
}

func BenchmarkFindOneStatement(b *testing.B) {
	sql := `INSERT INTO rides (rider, origin_lat, origin_lon, target_lat, target_lon) VALUES ($1, $2, $3, $4, $5) RETURNING id`
	for b.Loop() {
		Find(sql)
	}
}

func BenchmarkFindTwoStatements(b *testing.B) {
	sql := `INSERT INTO rides (rider, origin) VALUES ('a', 'b'); UPDATE rides SET origin = 'c' WHERE rider = 'a'`
	for b.Loop() {
		Find(sql)
	}
}

func FuzzFind(f *testing.F) {
	f.Add("SELECT 'a;b' ; COMMIT")
	f.Add("$tag$x$tag$; /* */ -- \n end")
	f.Fuzz(func(t *testing.T, sql string) {
		Find(sql) // must not panic or loop
	})
}

func TestRowStatements(t *testing.T) {
	for sql, want := range map[string]bool{
		`INSERT INTO t VALUES (1)`: true,
		`  select 1`:               true,
		`WITH x AS (DELETE FROM t RETURNING *) SELECT 1`:  true,
		`UPDATE t SET a = 1; DELETE FROM t;`:              true,
		`-- note` + "\n" + `MERGE INTO t USING s ON true`: true,
		`VALUES (1)`:                         true,
		`TABLE t`:                            true,
		`CALL p()`:                           false,
		`LOCK TABLE t`:                       false,
		`INSERT INTO t VALUES (1); CALL p()`: false,
		`DECLARE c CURSOR FOR SELECT 1`:      false,
		`DO $$ BEGIN COMMIT; END $$`:         false,
		`SAVEPOINT a`:                        false,
		`SET LOCAL x = 1`:                    false,
		`(SELECT 1)`:                         false,
		`/* only a comment */`:               false,
		``:                                   false,
		`INSERT INTO t VALUES ('a;b'); SELECT $$;CALL$$`: true,
		`SELECT 1; /* c */ COMMIT`:                       false,
	} {
		if got := RowStatements(sql); got != want {
			t.Errorf("RowStatements(%q) = %v, want %v", sql, got, want)
		}
	}
}
