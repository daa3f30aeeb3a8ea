module example.com/orders-go

go 1.26.0

require (
	github.com/jackc/pgx/v5 v5.12.0
	github.com/twmb/franz-go v1.22.2
)

require (
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/twmb/franz-go/pkg/kmsg v1.15.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)
