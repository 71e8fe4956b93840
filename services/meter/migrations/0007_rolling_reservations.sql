-- An endpoint replica's reservation rolls: it holds its whole amount (the endpoint's
-- horizon of spend) for as long as its allocation is open, instead of shrinking as
-- the ledger consumes it. Admission writes the flag with the reservation; the meter's
-- reserved figure and admission's budget both read it (kestrel/budget.py Hold.rolling).
ALTER TABLE reservations ADD COLUMN rolling boolean NOT NULL DEFAULT false;
