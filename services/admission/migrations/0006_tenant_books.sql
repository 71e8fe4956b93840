-- A version per tenant's book, so that several admission replicas may decide at once
-- and still never reserve a budget twice (issue 49). Every statement of admission's that
-- changes what a tenant's next decision depends on (a hold opened or released, a job
-- held, admitted, started or ended) bumps its tenant's version in the same statement.
-- The statements that open a hold (an admission, a held job released) are fenced: they
-- write only while the version is the one their decision read, so of two replicas that
-- decided from one snapshot, one commits and the other reads again and decides anew.
-- A replica whose book is older than the version it reads reloads that tenant's holds
-- and held jobs first. The row lock of the UPDATE serialises two such statements.
CREATE TABLE IF NOT EXISTS admission_books (
  tenant   text PRIMARY KEY,
  version  bigint NOT NULL CHECK (version > 0)
);
REVOKE ALL ON admission_books FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE ON admission_books TO kestrel_admission;
GRANT SELECT ON admission_books TO kestrel_reader;
