module txchaos/trapd

go 1.22
